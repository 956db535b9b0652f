//! Unit tests of CPU handles over mock memory: the claim, lock-free round trips, drain
//! requests, the tuning barrier, and remote frees racing the owner's.
extern crate std;

use crate::test_util::{SparseMem, Spec, n};
use crate::zonelist::FallbackOptions;
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
fn a_handle_counts_the_free_frames_of_the_pageblocks_it_holds() {
    let spec = Spec::uniform(1, 2048, 0);
    let mem = SparseMem::default();
    let m = spec.boot_with_cpus(&mem, &[n(0), n(0)]);
    let (c0, c1) = (m.cpu(0).unwrap(), m.cpu(1).unwrap());
    let free = || m.node(n(0)).unwrap().free_pages();
    let free0 = free();
    let mut h = m.claim_cpu(c0).unwrap();
    assert_eq!(h.cached_pages(), 0);
    let held: std::vec::Vec<Pfn> = (0..3)
        .map(|_| h.alloc(Order::ZERO, AllocFlags::empty()).unwrap())
        .collect();
    // Every frame is free in the zone, cached by the handle, or handed out.
    assert!(h.cached_pages() > 0, "a pageblock is lent");
    assert_eq!(free() + h.cached_pages() + 3, free0);
    assert_eq!(m.cached_pages(), 0, "the claimed cache is left out");
    // A remote free lands in the state array the handle holds.
    m.free_cpu(c1, held[0], Order::ZERO).unwrap();
    assert_eq!(free() + h.cached_pages() + 2, free0);
    // A drain request changes nothing until the handle's next operation honours it.
    let before = h.cached_pages();
    m.drain_cpu(c0);
    assert_eq!(h.cached_pages(), before);
    h.free(held[1], Order::ZERO).unwrap();
    assert_eq!(h.cached_pages(), 0);
    assert_eq!(free() + 1, free0);
    h.free(held[2], Order::ZERO).unwrap();
    drop(h);
    assert_eq!(free(), free0);
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
fn a_drain_request_is_honoured_by_operations_above_order_0() {
    let spec = Spec::uniform(1, 2048, 0);
    let mem = SparseMem::default();
    let m = spec.boot_with_cpus(&mem, &[n(0)]);
    let c0 = m.cpu(0).unwrap();
    let free0 = m.node(n(0)).unwrap().free_pages();
    let mut h = m.claim_cpu(c0).unwrap();
    let p = h.alloc(Order::ZERO, AllocFlags::empty()).unwrap();
    let big = h.alloc(Order::new(3), AllocFlags::empty()).unwrap();
    // A free above order 0 is the next operation: the pageblock goes back first.
    m.drain_cpu(c0);
    h.free(big, Order::new(3)).unwrap();
    assert_eq!(m.node(n(0)).unwrap().free_pages(), free0 - 1);
    // So is an allocation above order 0, after the cache took a pageblock again.
    h.free(p, Order::ZERO).unwrap();
    let p = h.alloc(Order::ZERO, AllocFlags::empty()).unwrap();
    assert!(
        m.node(n(0)).unwrap().free_pages() < free0 - 1,
        "a pageblock is lent"
    );
    m.drain_cpu(c0);
    let big = h.alloc(Order::new(3), AllocFlags::empty()).unwrap();
    assert_eq!(m.node(n(0)).unwrap().free_pages(), free0 - 1 - 8);
    h.free(big, Order::new(3)).unwrap();
    h.free(p, Order::ZERO).unwrap();
    drop(h);
    assert_eq!(m.node(n(0)).unwrap().free_pages(), free0);
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
fn a_handles_walk_above_order_0_gets_its_own_cache_back_under_pressure() {
    let spec = Spec::uniform(1, 1024, 0);
    let mem = SparseMem::default();
    let m = spec.boot_with_cpus(&mem, &[n(0)]);
    let c0 = m.cpu(0).unwrap();
    let free0 = m.node(n(0)).unwrap().free_pages();
    let mut h = m.claim_cpu(c0).unwrap();
    let p = h.alloc(Order::ZERO, AllocFlags::empty()).unwrap();
    let mut taken = std::vec::Vec::new();
    while let Some(q) = m.alloc(n(0), Order::ZERO, AllocFlags::empty()) {
        taken.push(q);
    }
    assert_eq!(m.node(n(0)).unwrap().free_pages(), 0);
    // Only the handle's own cache has free frames: its failing walk drains it (a request to
    // itself, as it is claimed) and the block comes from the frames it gave back.
    let big = h
        .alloc(Order::new(1), AllocFlags::empty())
        .expect("the handle's own cached frames serve the block");
    h.free(big, Order::new(1)).unwrap();
    h.free(p, Order::ZERO).unwrap();
    drop(h);
    for q in taken {
        m.free(q, Order::ZERO).unwrap();
    }
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

#[test]
fn alloc_bulk_pops_runs_and_counts_every_frame_once() {
    let spec = Spec::uniform(1, 4096, 0);
    let mem = SparseMem::default();
    let m = spec.boot_with_cpus(&mem, &[n(0)]);
    let c0 = m.cpu(0).unwrap();
    let free0 = m.node(n(0)).unwrap().free_pages();
    let stat0 = m.numastat(n(0)).unwrap();
    let mut h = m.claim_cpu(c0).unwrap();
    // More than a pageblock: runs from the hot pageblock, refills by the walk between them.
    let mut out = std::vec![Pfn::new(0); 1500];
    assert_eq!(h.alloc_bulk(AllocFlags::empty(), &mut out), 1500);
    let mut sorted = out.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), out.len(), "no frame twice");
    drop(h);
    // Every allocation preferred and got the node of the CPU that made it: Linux's
    // `zone_statistics` counts each as one hit and one local allocation.
    let stat = m.numastat(n(0)).unwrap();
    assert_eq!(stat.numa_hit - stat0.numa_hit, 1500);
    assert_eq!(stat.local_node - stat0.local_node, 1500);
    assert_eq!(
        stat.numa_miss + stat.other_node,
        stat0.numa_miss + stat0.other_node
    );
    // Every frame was handed out: each frees once.
    for &p in &out {
        m.free(p, Order::ZERO).unwrap();
    }
    m.drain_all();
    assert_eq!(m.node(n(0)).unwrap().free_pages(), free0);
    // Until memory runs out: a short count, then nothing.
    let mut h = m.claim_cpu(c0).unwrap();
    let mut all = std::vec![Pfn::new(0); free0 as usize + 10];
    assert_eq!(h.alloc_bulk(AllocFlags::empty(), &mut all), free0 as usize);
    assert_eq!(h.alloc_bulk(AllocFlags::empty(), &mut out), 0);
    h.free_bulk(&all[..free0 as usize]).unwrap();
    drop(h);
    m.drain_all();
    assert_eq!(m.node(n(0)).unwrap().free_pages(), free0);
    m.check_invariants().unwrap();
}

#[test]
fn a_handles_bulk_free_is_all_or_nothing() {
    let spec = Spec::uniform(1, 2048, 0);
    let mem = SparseMem::default();
    let m = spec.boot_with_cpus(&mem, &[n(0), n(0)]);
    let (c0, c1) = (m.cpu(0).unwrap(), m.cpu(1).unwrap());
    let free0 = m.node(n(0)).unwrap().free_pages();
    let mut h = m.claim_cpu(c0).unwrap();
    let mut f = [Pfn::new(0); 8];
    assert_eq!(h.alloc_bulk(AllocFlags::empty(), &mut f), 8);
    let lent = m.node(n(0)).unwrap().free_pages();
    let refused = |index, error| Err(BulkFreeError { index, error });
    // A duplicate within the slice, a frame another CPU freed already, frames the machine
    // does not own: each refused by index, with nothing freed.
    assert_eq!(
        h.free_bulk(&[f[0], f[1], f[2], f[1]]),
        refused(3, FreeError::Duplicate { pfn: f[1] })
    );
    m.free_cpu(c1, f[5], Order::ZERO).unwrap();
    assert_eq!(
        h.free_bulk(&[f[3], f[4], f[5]]),
        refused(2, FreeError::DoubleFree { pfn: f[5] })
    );
    for foreign in [Pfn::new(u64::MAX), Pfn::new(1 << 40)] {
        assert_eq!(
            h.free_bulk(&[f[3], foreign]),
            refused(1, FreeError::Foreign { pfn: foreign })
        );
        assert_eq!(
            h.free(foreign, Order::ZERO),
            Err(FreeError::Foreign { pfn: foreign })
        );
    }
    assert_eq!(m.node(n(0)).unwrap().free_pages(), lent);
    // The refused frames are not in the cache: new frames are other frames.
    let mut fresh = [Pfn::new(0); 16];
    assert_eq!(h.alloc_bulk(AllocFlags::empty(), &mut fresh), 16);
    assert!(
        fresh.iter().all(|p| !f.contains(p)),
        "a held frame handed out again"
    );
    h.free_bulk(&fresh).unwrap();
    // Every other frame is still handed out: the bulk frees them all, and a second time none.
    let rest = [f[0], f[1], f[2], f[3], f[4], f[6], f[7]];
    h.free_bulk(&rest).unwrap();
    assert_eq!(
        h.free_bulk(&rest),
        refused(0, FreeError::DoubleFree { pfn: f[0] })
    );
    // LIFO: the frames come back from the cache.
    let mut again = [Pfn::new(0); 7];
    assert_eq!(h.alloc_bulk(AllocFlags::empty(), &mut again), 7);
    again.sort();
    let mut rest_sorted = rest;
    rest_sorted.sort();
    assert_eq!(again, rest_sorted);
    h.free_bulk(&again).unwrap();
    drop(h);
    m.drain_all();
    assert_eq!(m.node(n(0)).unwrap().free_pages(), free0);
    m.check_invariants().unwrap();
}

#[test]
fn a_handles_bulk_free_of_other_frames_goes_through_the_zones() {
    let spec = Spec::uniform(1, 2048, 0);
    let mem = SparseMem::default();
    let m = spec.boot_with_cpus(&mem, &[n(0), n(0)]);
    let (c0, c1) = (m.cpu(0).unwrap(), m.cpu(1).unwrap());
    let free0 = m.node(n(0)).unwrap().free_pages();
    let mut h = m.claim_cpu(c0).unwrap();
    // The handle's own frames, a frame of the zone, a frame of CPU 1's cache.
    let mut f = [Pfn::new(0); 4];
    assert_eq!(h.alloc_bulk(AllocFlags::empty(), &mut f), 4);
    let zone = m.alloc(n(0), Order::ZERO, AllocFlags::empty()).unwrap();
    let other = m.alloc_cpu(c1, Order::ZERO, AllocFlags::empty()).unwrap();
    let all = [f[0], zone, f[1], other, f[2], f[3]];
    // A duplicate is still caught, by index, on this path too.
    assert_eq!(
        h.free_bulk(&[f[0], zone, f[0]]),
        Err(BulkFreeError {
            index: 2,
            error: FreeError::Duplicate { pfn: f[0] }
        })
    );
    h.free_bulk(&all).unwrap();
    assert_eq!(
        h.free(zone, Order::ZERO),
        Err(FreeError::DoubleFree { pfn: zone })
    );
    drop(h);
    m.drain_all();
    assert_eq!(m.node(n(0)).unwrap().free_pages(), free0);
    m.check_invariants().unwrap();
}

#[test]
fn a_new_tuning_reaches_a_claimed_cpus_frees() {
    let spec = Spec::uniform(1, 2048, 0);
    let mem = SparseMem::default();
    let m = spec.boot_with_cpus(&mem, &[n(0)]);
    let c0 = m.cpu(0).unwrap();
    let free0 = m.node(n(0)).unwrap().free_pages();
    let mut h = m.claim_cpu(c0).unwrap();
    let p = h.alloc(Order::ZERO, AllocFlags::empty()).unwrap();
    // At most one free frame per pageblock: the request drains the cache at the next
    // operation, the allocation lends a pageblock again, and its free leaves two free frames
    // in it, one more than `high`: the pageblock goes back.
    m.set_pcp(PcpConfig { batch: 1, high: 1 });
    let q = h.alloc(Order::ZERO, AllocFlags::empty()).unwrap();
    h.free(q, Order::ZERO).unwrap();
    assert_eq!(
        m.node(n(0)).unwrap().free_pages(),
        free0 - 1,
        "only p is out"
    );
    h.free(p, Order::ZERO).unwrap();
    drop(h);
    m.drain_all();
    assert_eq!(m.node(n(0)).unwrap().free_pages(), free0);
    m.check_invariants().unwrap();
}

/// docs/promises.md (Concurrency) says numastat read while another CPU allocates
/// "counters only grow" (loom `observe.rs`: "numastat counters only ever grow while they are
/// read"), as Linux's never go down. A CPU that claimed its cache made every event its cache
/// counted before the claim vanish from `Machine::numastat` until the handle dropped.
#[test]
fn numastat_never_goes_down_when_a_cpu_is_claimed() {
    let spec = Spec::uniform(1, 2048, 0);
    let mem = SparseMem::default();
    let m = spec.boot_with_cpus(&mem, &[n(0)]);
    let c0 = m.cpu(0).unwrap();
    let held: std::vec::Vec<Pfn> = (0..10)
        .map(|_| m.alloc_cpu(c0, Order::ZERO, AllocFlags::empty()).unwrap())
        .collect();
    let before = m.numastat(n(0)).unwrap();
    assert_eq!((before.numa_hit, before.local_node), (10, 10));
    // The CPU's owner claims its cache (and allocates nothing yet).
    let h = m.claim_cpu(c0).unwrap();
    let during = m.numastat(n(0)).unwrap();
    assert!(
        during.numa_hit >= before.numa_hit && during.local_node >= before.local_node,
        "numastat went down from {before:?} to {during:?} when CPU 0 was claimed"
    );
    drop(h);
    for p in held {
        m.free(p, Order::ZERO).unwrap();
    }
}

/// A handle's free keeps a pageblock while it leaves at most `high` frames free in it, and
/// gives it back with the free that leaves one more (`PcpConfig::high`), on its hot path too.
#[test]
fn a_handles_free_gives_its_pageblock_back_past_high_and_not_before() {
    const HIGH: u64 = 8;
    let spec = Spec::uniform(1, 2048, 0);
    let mem = SparseMem::default();
    let m = spec.boot_with_cpus(&mem, &[n(0)]);
    m.set_pcp(PcpConfig {
        batch: 1,
        high: HIGH as u32,
    });
    let mut h = m.claim_cpu(m.cpu(0).unwrap()).unwrap();
    let zone_free = || m.node(n(0)).unwrap().free_pages();
    // Every frame of the first pageblock lent: its stack is empty, and it stays the hot slot.
    let before = zone_free();
    let mut frames = std::vec![h.alloc(Order::ZERO, AllocFlags::empty()).unwrap()];
    let in_block = before - zone_free();
    assert!(in_block > HIGH + 1);
    frames.extend((1..in_block).map(|_| h.alloc(Order::ZERO, AllocFlags::empty()).unwrap()));
    let block = frames[0].get() >> 9;
    assert!(frames.iter().all(|p| p.get() >> 9 == block));
    let lent = zone_free();
    for (i, &p) in frames.iter().enumerate().take(HIGH as usize) {
        h.free(p, Order::ZERO).unwrap();
        assert_eq!(zone_free(), lent, "{} frames free in it: kept", i + 1);
    }
    h.free(frames[HIGH as usize], Order::ZERO).unwrap();
    assert_eq!(zone_free(), lent + HIGH + 1, "one more than high: back");
    for &p in &frames[HIGH as usize + 1..] {
        h.free(p, Order::ZERO).unwrap();
    }
    drop(h);
    m.drain_all();
    m.check_invariants().unwrap();
}

/// A [`CpuKick`] that records the CPUs it is asked to wake.
#[derive(Default)]
struct Kicks(std::sync::Mutex<std::vec::Vec<CpuId>>);

impl CpuKick for Kicks {
    fn kick(&self, cpu: CpuId) {
        self.0.lock().unwrap().push(cpu);
    }
}

impl Kicks {
    fn seen(&self) -> std::vec::Vec<CpuId> {
        self.0.lock().unwrap().clone()
    }
}

#[test]
fn a_claimed_cpu_is_kicked_once_per_drain_request_and_its_poll_gives_the_cache_back() {
    let spec = Spec::uniform(1, 2048, 0);
    let mem = SparseMem::default();
    let kicks = Kicks::default();
    let m = spec
        .boot_with_cpus(&mem, &[n(0), n(0), n(0)])
        .with_kick(&kicks);
    let (c0, c1) = (m.cpu(0).unwrap(), m.cpu(1).unwrap());
    let free0 = m.node(n(0)).unwrap().free_pages();
    let mut h = m.claim_cpu(c1).unwrap();
    assert!(!h.poll(), "nothing asked yet");
    let p = h.alloc(Order::ZERO, AllocFlags::empty()).unwrap();
    h.free(p, Order::ZERO).unwrap();
    assert!(h.cached_pages() > 0);
    // An unclaimed CPU is drained on the spot: nobody to wake.
    m.drain_cpu(c0);
    assert_eq!(kicks.seen(), []);
    m.drain_cpu(c1);
    assert_eq!(kicks.seen(), [c1]);
    assert!(h.cached_pages() > 0, "the request waits for the owner");
    // The request still waits: no second kick, and none for the unclaimed CPUs.
    m.drain_all();
    assert_eq!(kicks.seen(), [c1]);
    assert!(h.poll(), "a drain had asked");
    assert_eq!(h.cached_pages(), 0);
    assert_eq!(m.node(n(0)).unwrap().free_pages(), free0);
    assert!(!h.poll(), "honoured once");
    // A CPU whose cache holds no pageblock has nothing to give back: the request waits for
    // its next operation, and nobody is woken (as Linux's `drain_all_pages` skips CPUs with
    // empty lists).
    m.drain_cpu(c1);
    m.drain_all();
    assert_eq!(kicks.seen(), [c1]);
    assert!(h.poll(), "the request waited");
    // Once it holds a pageblock again, a new request wakes it again.
    let p = h.alloc(Order::ZERO, AllocFlags::empty()).unwrap();
    h.free(p, Order::ZERO).unwrap();
    assert!(h.cached_pages() > 0);
    m.drain_cpu(c1);
    assert_eq!(kicks.seen(), [c1, c1]);
    assert!(h.poll());
    assert_eq!(h.cached_pages(), 0);
    drop(h);
    m.check_invariants().unwrap();
}

/// A claim finds the cache as the locked API left it: holding pageblocks, its CPU is woken by
/// the first request; holding none, by none until it takes one.
#[test]
fn a_new_claim_is_kicked_exactly_when_its_cache_holds_a_pageblock() {
    let spec = Spec::uniform(1, 2048, 0);
    let mem = SparseMem::default();
    let kicks = Kicks::default();
    let m = spec.boot_with_cpus(&mem, &[n(0), n(0)]).with_kick(&kicks);
    let c1 = m.cpu(1).unwrap();
    // The locked API fills CPU 1's cache before any handle.
    let p = m.alloc_cpu(c1, Order::ZERO, AllocFlags::empty()).unwrap();
    m.free_cpu(c1, p, Order::ZERO).unwrap();
    let h = m.claim_cpu(c1).unwrap();
    assert!(h.cached_pages() > 0);
    m.drain_cpu(c1);
    assert_eq!(kicks.seen(), [c1]);
    drop(h);
    // The drop gave the pageblock back; a claim of the empty cache is not woken.
    let mut h = m.claim_cpu(c1).unwrap();
    assert_eq!(h.cached_pages(), 0);
    m.drain_cpu(c1);
    assert_eq!(kicks.seen(), [c1]);
    assert!(h.poll());
    drop(h);
    m.check_invariants().unwrap();
}

#[test]
fn a_failing_walk_kicks_the_idle_claimed_cpus_but_not_the_one_walking() {
    let spec = Spec::uniform(1, 1024, 0);
    let mem = SparseMem::default();
    let kicks = Kicks::default();
    let m = spec.boot_with_cpus(&mem, &[n(0), n(0)]).with_kick(&kicks);
    let (c0, c1) = (m.cpu(0).unwrap(), m.cpu(1).unwrap());
    let free0 = m.node(n(0)).unwrap().free_pages();
    let (mut h0, mut h1) = (m.claim_cpu(c0).unwrap(), m.claim_cpu(c1).unwrap());
    let p = h1.alloc(Order::ZERO, AllocFlags::empty()).unwrap();
    // CPU 0 takes everything else; its last walk fails, and asks both caches back: its own
    // in its retry, CPU 1's by a request and a kick.
    let mut taken = std::vec![p];
    while let Some(q) = h0.alloc(Order::ZERO, AllocFlags::empty()) {
        taken.push(q);
    }
    assert_eq!(kicks.seen(), [c1]);
    let stranded = h1.cached_pages();
    assert!(stranded > 0);
    // Once CPU 1 polls, its frames serve CPU 0.
    assert!(h1.poll());
    for _ in 0..stranded {
        taken.push(h0.alloc(Order::ZERO, AllocFlags::empty()).unwrap());
    }
    assert_eq!(m.node(n(0)).unwrap().free_pages(), 0);
    for q in taken {
        h0.free(q, Order::ZERO).unwrap();
    }
    drop((h0, h1));
    m.drain_all();
    assert_eq!(m.node(n(0)).unwrap().free_pages(), free0);
    m.check_invariants().unwrap();
}

#[test]
fn an_offline_refused_for_an_idle_claimed_cache_succeeds_once_the_kicked_cpu_polls() {
    let spec = Spec::uniform(1, 2048, 0);
    let mem = SparseMem::default();
    let kicks = Kicks::default();
    let m = spec.boot_with_cpus(&mem, &[n(0), n(0)]).with_kick(&kicks);
    let c1 = m.cpu(1).unwrap();
    let added = PhysRange::new(Pfn::new(1 << 14), Pfn::new((1 << 14) + 2048)).unwrap();
    m.hot_add(&mem, n(0), added, FallbackOptions::default())
        .unwrap();
    // Boot memory all taken: CPU 1's cache can only hold a pageblock of the added range.
    let mut boot = std::vec::Vec::new();
    loop {
        let p = m.alloc(n(0), Order::ZERO, AllocFlags::empty()).unwrap();
        if added.contains(p) {
            m.free(p, Order::ZERO).unwrap();
            break;
        }
        boot.push(p);
    }
    let mut h = m.claim_cpu(c1).unwrap();
    let p = h.alloc(Order::ZERO, AllocFlags::empty()).unwrap();
    assert!(added.contains(p));
    h.free(p, Order::ZERO).unwrap();
    assert!(h.cached_pages() > 0);
    let opts = OfflineOptions::default();
    assert!(matches!(
        m.offline(&mem, added, opts),
        Err(OfflineError::Busy { .. })
    ));
    assert_eq!(kicks.seen(), [c1]);
    assert!(h.poll());
    m.offline(&mem, added, opts).unwrap();
    assert_eq!(m.node_of(added.start()), None);
    drop(h);
    m.free_bulk(&boot).unwrap();
    m.check_invariants().unwrap();
}

/// A handle's walk above order 0 that fails, drains the caches and then succeeds leaves no
/// request of its own waiting (it would pass for one the CPU was kicked for). Its cache, given
/// back, holds no pageblock then, so a later failing walk elsewhere wakes nobody.
#[test]
fn a_handles_big_walk_that_succeeds_after_draining_leaves_no_request_of_its_own() {
    let spec = Spec::uniform(1, 2048, 0);
    let mem = SparseMem::default();
    let kicks = Kicks::default();
    let m = spec.boot_with_cpus(&mem, &[n(0), n(0)]).with_kick(&kicks);
    let (c0, c1) = (m.cpu(0).unwrap(), m.cpu(1).unwrap());
    let free0 = m.node(n(0)).unwrap().free_pages();
    let mut taken: std::vec::Vec<Pfn> =
        core::iter::from_fn(|| m.alloc(n(0), Order::ZERO, AllocFlags::empty())).collect();
    taken.sort_unstable();
    // Two pageblocks wholly handed out: the first 32 frames of each are freed, so that CPU 1
    // borrows one and CPU 0 the other.
    let blocks: std::vec::Vec<u64> = taken
        .chunk_by(|x, y| x.get() >> 9 == y.get() >> 9)
        .filter(|run| run.len() == 512)
        .map(|run| run[0].get())
        .collect();
    let (a, b) = (blocks[0], blocks[1]);
    let freed = |base: u64| (base..base + 32).map(Pfn::new);
    for p in freed(a) {
        m.free(p, Order::ZERO).unwrap();
    }
    taken.retain(|p| !(a..a + 32).contains(&p.get()));
    let mut h = m.claim_cpu(c1).unwrap();
    let p = h.alloc(Order::ZERO, AllocFlags::empty()).unwrap();
    h.free(p, Order::ZERO).unwrap();
    assert_eq!(h.cached_pages(), 32);
    for p in freed(b) {
        m.free(p, Order::ZERO).unwrap();
    }
    taken.retain(|p| !(b..b + 32).contains(&p.get()));
    let q = m.alloc_cpu(c0, Order::ZERO, AllocFlags::empty()).unwrap();
    m.free_cpu(c0, q, Order::ZERO).unwrap();
    assert_eq!(m.cached_pages(), 32);
    // The zones have nothing: CPU 1's order-1 walk fails, drains CPU 0's cache, and its
    // retry takes a block of the pageblock given back.
    let big = h.alloc(Order::new(1), AllocFlags::empty()).unwrap();
    assert!((b..b + 32).contains(&big.get()));
    assert_eq!(kicks.seen(), [], "no CPU but the walking one was claimed");
    assert!(!h.poll(), "its own request stayed waiting");
    assert_eq!(h.cached_pages(), 0);
    // Another walk fails: it posts CPU 1, idle with nothing cached, a request that wakes
    // nobody and waits for its next operation.
    assert_eq!(m.alloc(n(0), Order::new(9), AllocFlags::empty()), None);
    assert_eq!(kicks.seen(), [], "a CPU with nothing cached is not kicked");
    assert!(h.poll());
    h.free(big, Order::new(1)).unwrap();
    drop(h);
    m.free_bulk(&taken).unwrap();
    m.drain_all();
    assert_eq!(m.node(n(0)).unwrap().free_pages(), free0);
    m.check_invariants().unwrap();
}

#[test]
fn an_empty_bulk_allocation_honours_a_drain_request_as_every_operation_does() {
    let spec = Spec::uniform(1, 2048, 0);
    let mem = SparseMem::default();
    let m = spec.boot_with_cpus(&mem, &[n(0)]);
    let c0 = m.cpu(0).unwrap();
    let free0 = m.node(n(0)).unwrap().free_pages();
    let mut h = m.claim_cpu(c0).unwrap();
    let p = h.alloc(Order::ZERO, AllocFlags::empty()).unwrap();
    h.free(p, Order::ZERO).unwrap();
    assert!(h.cached_pages() > 0);
    m.drain_cpu(c0);
    assert_eq!(h.alloc_bulk(AllocFlags::empty(), &mut []), 0);
    assert_eq!(h.cached_pages(), 0, "the request was honoured");
    assert_eq!(m.node(n(0)).unwrap().free_pages(), free0);
    assert!(!h.poll(), "nothing left to honour");
    drop(h);
    m.check_invariants().unwrap();
}

/// As above, for a big walk whose retry fails too.
#[test]
fn a_handles_big_walk_that_fails_twice_leaves_no_request_of_its_own() {
    let spec = Spec::uniform(1, 1024, 0);
    let mem = SparseMem::default();
    let kicks = Kicks::default();
    let m = spec.boot_with_cpus(&mem, &[n(0), n(0)]).with_kick(&kicks);
    let c0 = m.cpu(0).unwrap();
    let mut h = m.claim_cpu(c0).unwrap();
    let p = h.alloc(Order::ZERO, AllocFlags::empty()).unwrap();
    h.free(p, Order::ZERO).unwrap();
    let taken: std::vec::Vec<Pfn> =
        core::iter::from_fn(|| m.alloc(n(0), Order::ZERO, AllocFlags::empty())).collect();
    // The node API's last walk failed and asked CPU 0's cache back: one kick, then a poll.
    assert_eq!(kicks.seen(), [c0]);
    assert!(h.poll());
    // The handle's own walk fails, drains (a request to itself, which kicks nobody), retries
    // and fails again: it must not leave that request waiting.
    assert_eq!(h.alloc(Order::new(9), AllocFlags::empty()), None);
    assert_eq!(kicks.seen(), [c0]);
    assert!(!h.poll(), "its own request stayed waiting");
    drop(h);
    m.free_bulk(&taken).unwrap();
    m.check_invariants().unwrap();
}
