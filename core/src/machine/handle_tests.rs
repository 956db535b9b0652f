//! Unit tests of CPU handles over mock memory: the claim, lock-free round trips, drain
//! requests, the tuning barrier, and remote frees racing the owner's.
extern crate std;

use crate::test_util::{SparseMem, Spec, n};
use crate::*;

#[test]
fn a_cpu_is_claimed_once_until_its_handle_drops() {
    let spec = Spec::uniform(1, 2048, 0);
    let mem = SparseMem::default();
    let m = spec.boot_with_cpus(&mem, &[n(0), n(0)]);
    let (c0, c1) = (m.cpu(0).unwrap(), m.cpu(1).unwrap());
    let h = m.claim_cpu(c0).unwrap();
    assert_eq!(h.cpu(), c0);
    assert_eq!(
        m.claim_cpu(c0).map(|_| ()),
        Err(ClaimError::Claimed { cpu: 0 })
    );
    let h1 = m.claim_cpu(c1).unwrap();
    drop(h);
    drop(m.claim_cpu(c0).unwrap());
    drop(h1);
    m.check_invariants().unwrap();
}

#[test]
fn handle_round_trip_and_remote_double_free() {
    let spec = Spec::uniform(1, 2048, 0);
    let mem = SparseMem::default();
    let m = spec.boot_with_cpus(&mem, &[n(0), n(0)]);
    let (c0, c1) = (m.cpu(0).unwrap(), m.cpu(1).unwrap());
    let free0 = m.node(n(0)).unwrap().free_pages();
    let mut h = m.claim_cpu(c0).unwrap();
    let p = h.alloc(Order::ZERO, AllocFlags::empty()).unwrap();
    assert!(
        m.node(n(0)).unwrap().free_pages() < free0 - 1,
        "a pageblock is lent"
    );
    h.free(p, Order::ZERO).unwrap();
    assert_eq!(
        h.free(p, Order::ZERO),
        Err(FreeError::DoubleFree { pfn: p })
    );
    // LIFO: the same frame again; a remote free wins it, the owner's then fails.
    assert_eq!(h.alloc(Order::ZERO, AllocFlags::empty()), Some(p));
    m.free_cpu(c1, p, Order::ZERO).unwrap();
    assert_eq!(
        h.free(p, Order::ZERO),
        Err(FreeError::DoubleFree { pfn: p })
    );
    // The locked API of a claimed CPU goes around its cache.
    let q = m.alloc_cpu(c0, Order::ZERO, AllocFlags::empty()).unwrap();
    m.free_cpu(c0, q, Order::ZERO).unwrap();
    let r = h.alloc(Order::ZERO, AllocFlags::empty()).unwrap();
    // SAFETY: `r` was just handed out at order 0 and nothing else frees it.
    #[allow(unsafe_code)]
    unsafe { h.free_unchecked(r) }.unwrap();
    let big = h.alloc(Order::new(3), AllocFlags::empty()).unwrap();
    h.free(big, Order::new(3)).unwrap();
    drop(h);
    m.drain_all();
    assert_eq!(m.cached_pages(), 0);
    assert_eq!(m.node(n(0)).unwrap().free_pages(), free0);
    m.check_invariants().unwrap();
}

#[test]
fn a_drain_of_a_claimed_cpu_is_honoured_at_its_next_operation() {
    let spec = Spec::uniform(1, 2048, 0);
    let mem = SparseMem::default();
    let m = spec.boot_with_cpus(&mem, &[n(0)]);
    let c0 = m.cpu(0).unwrap();
    let free0 = m.node(n(0)).unwrap().free_pages();
    let mut h = m.claim_cpu(c0).unwrap();
    let p = h.alloc(Order::ZERO, AllocFlags::empty()).unwrap();
    let lent = m.node(n(0)).unwrap().free_pages();
    m.drain_all();
    assert_eq!(m.node(n(0)).unwrap().free_pages(), lent, "only a request");
    // The free honours it first: the pageblock goes back, then `p` to its zone.
    h.free(p, Order::ZERO).unwrap();
    assert_eq!(m.node(n(0)).unwrap().free_pages(), free0);
    // The request at drop.
    let _q = h.alloc(Order::ZERO, AllocFlags::empty()).unwrap();
    m.drain_cpu(c0);
    assert!(m.node(n(0)).unwrap().free_pages() < free0 - 1);
    drop(h);
    assert_eq!(m.node(n(0)).unwrap().free_pages(), free0 - 1);
    m.check_invariants().unwrap();
}

#[test]
fn caching_off_is_a_barrier_for_a_claimed_cpu() {
    let spec = Spec::uniform(1, 2048, 0);
    let mem = SparseMem::default();
    let m = spec.boot_with_cpus(&mem, &[n(0)]);
    let c0 = m.cpu(0).unwrap();
    let free0 = m.node(n(0)).unwrap().free_pages();
    let mut h = m.claim_cpu(c0).unwrap();
    let p = h.alloc(Order::ZERO, AllocFlags::empty()).unwrap();
    m.set_pcp(PcpConfig::OFF);
    let q = h.alloc(Order::ZERO, AllocFlags::empty()).unwrap();
    assert_eq!(
        m.node(n(0)).unwrap().free_pages(),
        free0 - 2,
        "nothing cached"
    );
    h.free(p, Order::ZERO).unwrap();
    h.free(q, Order::ZERO).unwrap();
    assert_eq!(m.node(n(0)).unwrap().free_pages(), free0);
    drop(h);
    m.check_invariants().unwrap();
}

#[test]
fn a_handle_gives_its_own_cache_back_under_pressure() {
    let spec = Spec::uniform(1, 1024, 0);
    let mem = SparseMem::default();
    let m = spec.boot_with_cpus(&mem, &[n(0)]);
    let c0 = m.cpu(0).unwrap();
    let free0 = m.node(n(0)).unwrap().free_pages();
    let mut h = m.claim_cpu(c0).unwrap();
    let p = h.alloc(Order::ZERO, AllocFlags::empty()).unwrap();
    // The node API takes every frame the zone has; the handle's walk then fails, drains
    // (a request to itself, honoured by its retry) and gets its own cached frames back.
    let mut taken = std::vec![p];
    while let Some(q) = m.alloc(n(0), Order::ZERO, AllocFlags::empty()) {
        taken.push(q);
    }
    while let Some(q) = h.alloc(Order::ZERO, AllocFlags::empty()) {
        taken.push(q);
    }
    assert_eq!(m.node(n(0)).unwrap().free_pages(), 0);
    let mut sorted = taken.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), taken.len(), "no frame twice");
    for q in taken {
        h.free(q, Order::ZERO).unwrap();
    }
    drop(h);
    m.drain_all();
    assert_eq!(m.node(n(0)).unwrap().free_pages(), free0);
    m.check_invariants().unwrap();
}

#[test]
fn the_hot_slot_follows_drains_and_flags() {
    let spec = Spec::uniform(1, 2048, 0);
    let mem = SparseMem::default();
    let m = spec.boot_with_cpus(&mem, &[n(0)]);
    let c0 = m.cpu(0).unwrap();
    let free0 = m.node(n(0)).unwrap().free_pages();
    let mut h = m.claim_cpu(c0).unwrap();
    // The first allocation lends a pageblock, the second pops from it and makes it hot, the
    // third pops from the hot slot: LIFO, the same frame each time.
    let p = h.alloc(Order::ZERO, AllocFlags::empty()).unwrap();
    h.free(p, Order::ZERO).unwrap();
    assert_eq!(h.alloc(Order::ZERO, AllocFlags::empty()), Some(p));
    h.free(p, Order::ZERO).unwrap();
    assert_eq!(h.alloc(Order::ZERO, AllocFlags::empty()), Some(p));
    let lent = m.node(n(0)).unwrap().free_pages();
    // Another class does not use the hot slot: it gets a pageblock of its own.
    let s = h.alloc(Order::ZERO, AllocFlags::SHORT_LIVED).unwrap();
    assert!(
        m.node(n(0)).unwrap().free_pages() < lent,
        "a second pageblock"
    );
    // A drain empties the hot slot: the next allocation walks and a pageblock is lent again.
    let before = m.node(n(0)).unwrap().free_pages();
    m.drain_all();
    assert_eq!(m.node(n(0)).unwrap().free_pages(), before, "only a request");
    let q = h.alloc(Order::ZERO, AllocFlags::empty()).unwrap();
    m.check_invariants().unwrap();
    for f in [p, q, s] {
        h.free(f, Order::ZERO).unwrap();
    }
    drop(h);
    m.drain_all();
    assert_eq!(m.node(n(0)).unwrap().free_pages(), free0);
    m.check_invariants().unwrap();
}
