//! Unit tests of the per-CPU paths over mock memory: cached round trips, remote frees,
//! pressure drains, tuning, and the races the soundness audit found.
extern crate std;
use std::vec::Vec;

use crate::percpu::MAX_BATCH;
use crate::test_util::{SparseMem, Spec, n};
use crate::*;

#[test]
fn cached_round_trip_and_double_free() {
    let spec = Spec::uniform(2, 2048, 0);
    let mem = SparseMem::default();
    let m = spec.boot_with_cpus(&mem, &[n(0), n(1)]);
    let (c0, c1) = (m.cpu(0).unwrap(), m.cpu(1).unwrap());
    assert!(m.cpu(2).is_none());
    let free0 = m.node(n(0)).unwrap().free_pages();
    let p = m.alloc_cpu(c0, Order::ZERO, AllocFlags::empty()).unwrap();
    assert_eq!(m.node_of(p), Some(n(0)));
    // The CPU holds one pageblock: what left the zone is that pageblock's free frames, all
    // cached but the one handed out.
    let lent = free0 - m.node(n(0)).unwrap().free_pages();
    assert!((1..=512).contains(&lent), "one pageblock's frames: {lent}");
    assert_eq!(m.cached_pages(), lent - 1);
    m.check_invariants().unwrap();
    m.free_cpu(c0, p, Order::ZERO).unwrap();
    assert_eq!(
        m.free_cpu(c0, p, Order::ZERO),
        Err(FreeError::DoubleFree { pfn: p })
    );
    assert_eq!(
        m.free(p, Order::ZERO),
        Err(FreeError::DoubleFree { pfn: p }),
        "a cached frame is not the caller's"
    );
    assert_eq!(
        m.free_cpu(c1, p, Order::ZERO),
        Err(FreeError::DoubleFree { pfn: p })
    );
    assert_eq!(
        m.free_cpu(c1, Pfn::new(1 << 40), Order::ZERO),
        Err(FreeError::Foreign {
            pfn: Pfn::new(1 << 40)
        })
    );
    m.check_invariants().unwrap();
    // The same frame comes back first (LIFO, cache-hot).
    assert_eq!(m.alloc_cpu(c0, Order::ZERO, AllocFlags::empty()), Some(p));
    m.free_cpu(c0, p, Order::ZERO).unwrap();
    m.drain_all();
    assert_eq!(m.cached_pages(), 0);
    assert_eq!(m.node(n(0)).unwrap().free_pages(), free0);
    m.check_invariants().unwrap();
}

#[test]
fn remote_frees_go_to_their_own_node_and_numastat_sums_cpus() {
    let spec = Spec::uniform(2, 2048, 0);
    let mem = SparseMem::default();
    let m = spec.boot_with_cpus(&mem, &[n(0), n(1)]);
    let (c0, c1) = (m.cpu(0).unwrap(), m.cpu(1).unwrap());
    let frames: Vec<Pfn> = (0..10)
        .map(|_| m.alloc_cpu(c0, Order::ZERO, AllocFlags::empty()).unwrap())
        .collect();
    for p in &frames {
        m.free_cpu(c1, *p, Order::ZERO).unwrap();
    }
    m.check_invariants().unwrap();
    // CPU 1 now caches node-0 frames on its node-0 list; its own node's allocations do not
    // take them.
    let q = m.alloc_cpu(c1, Order::ZERO, AllocFlags::empty()).unwrap();
    assert_eq!(m.node_of(q), Some(n(1)));
    let s0 = m.numastat(n(0)).unwrap();
    assert_eq!((s0.numa_hit, s0.local_node), (10, 10));
    assert_eq!(m.numastat(n(1)).unwrap().local_node, 1);
    m.free_cpu(c1, q, Order::ZERO).unwrap();
    m.drain_cpu(c1);
    m.drain_cpu(c0);
    assert_eq!(m.cached_pages(), 0);
    m.check_invariants().unwrap();
}

#[test]
fn cached_frames_never_fail_an_allocation() {
    let spec = Spec::uniform(1, 1024, 0);
    let mem = SparseMem::default();
    let m = spec.boot_with_cpus(&mem, &[n(0), n(0)]);
    let (c0, c1) = (m.cpu(0).unwrap(), m.cpu(1).unwrap());
    let total = m.node(n(0)).unwrap().free_pages();
    // CPU 1 takes a batch into its cache, then everything else is allocated by CPU 0.
    let p = m.alloc_cpu(c1, Order::ZERO, AllocFlags::empty()).unwrap();
    let mut held = Vec::new();
    while let Some(q) = m.alloc_cpu(c0, Order::ZERO, AllocFlags::empty()) {
        held.push(q);
    }
    assert_eq!(
        held.len() as u64 + 1,
        total,
        "CPU 1's cached frames were drained for CPU 0"
    );
    assert!(m.alloc(n(0), Order::ZERO, AllocFlags::empty()).is_none());
    m.free_cpu(c1, p, Order::ZERO).unwrap();
    assert!(
        m.alloc(n(0), Order::ZERO, AllocFlags::empty()).is_some(),
        "a node walk drains caches too"
    );
    m.check_invariants().unwrap();
}

#[test]
fn caches_off_and_tuning() {
    let spec = Spec::uniform(1, 1024, 0);
    let mem = SparseMem::default();
    let m = spec.boot_with_cpus(&mem, &[n(0)]);
    let c = m.cpu(0).unwrap();
    m.set_pcp(PcpConfig::OFF);
    let p = m.alloc_cpu(c, Order::ZERO, AllocFlags::empty()).unwrap();
    assert_eq!(m.cached_pages(), 0);
    m.free_cpu(c, p, Order::ZERO).unwrap();
    m.set_pcp(PcpConfig {
        batch: 1000,
        high: 2,
    });
    assert_eq!(
        m.pcp(),
        PcpConfig {
            batch: MAX_BATCH,
            high: MAX_BATCH
        }
    );
    m.set_pcp(PcpConfig { batch: 4, high: 8 });
    let frames: Vec<Pfn> = (0..20)
        .map(|_| m.alloc_cpu(c, Order::ZERO, AllocFlags::empty()).unwrap())
        .collect();
    for p in frames {
        m.free_cpu(c, p, Order::ZERO).unwrap();
        assert!(m.cached_pages() <= 8, "a list above high drains a batch");
    }
    m.check_invariants().unwrap();
    let big = m.alloc_cpu(c, Order::new(3), AllocFlags::empty()).unwrap();
    assert_eq!(
        m.free_cpu(c, big, Order::ZERO),
        Err(FreeError::WrongOrder {
            pfn: big,
            given: Order::ZERO,
            allocated: Order::new(3)
        })
    );
    m.free_cpu(c, big, Order::new(3)).unwrap();
    m.check_invariants().unwrap();
}

/// A per-CPU free of a frame that is never a block's head (a misuse it must refuse) runs while
/// another CPU allocates and frees the memory around it: Miri checks that every access the two
/// make to the metadata is synchronised, and the refusal holds in every interleaving.
#[test]
fn refused_cpu_free_races_an_allocation_that_prepares_its_metadata() {
    let spec = Spec::uniform(1, 2048, 0);
    let mem = SparseMem::default();
    let m = spec.boot_with_cpus(&mem, &[n(0), n(0)]);
    let (c0, c1) = (m.cpu(0).unwrap(), m.cpu(1).unwrap());
    // Frame 701 is never the head of an order-2 block: free, or inside one.
    let inside = Pfn::new(701);
    // The barrier orders CPU 0's first free before CPU 1's allocations; CPU 0's later frees
    // and CPU 1's allocations are not ordered at all.
    let start = std::sync::Barrier::new(2);
    std::thread::scope(|s| {
        s.spawn(|| {
            assert!(m.free_cpu(c0, inside, Order::ZERO).is_err());
            start.wait();
            for _ in 0..8 {
                assert!(m.free_cpu(c0, inside, Order::ZERO).is_err());
                std::thread::yield_now();
            }
        });
        s.spawn(|| {
            start.wait();
            // Everything, so that the metadata around the refused frame changes.
            let mut held = Vec::new();
            while let Some(p) = m.alloc_cpu(c1, Order::new(2), AllocFlags::empty()) {
                held.push(p);
            }
            for p in held {
                m.free_cpu(c1, p, Order::new(2)).unwrap();
            }
        });
    });
    m.check_invariants().unwrap();
}

/// `pcp()` returns a configuration that was set, never a mix of two.
#[test]
fn tuning_is_read_whole() {
    let spec = Spec::uniform(1, 1024, 0);
    let mem = SparseMem::default();
    let m = spec.boot_with_cpus(&mem, &[n(0)]);
    let a = PcpConfig { batch: 1, high: 1 };
    let b = PcpConfig {
        batch: 200,
        high: 400,
    };
    let rounds = if cfg!(miri) { 50 } else { 200_000 };
    m.set_pcp(a);
    std::thread::scope(|s| {
        s.spawn(|| {
            for i in 0..rounds {
                m.set_pcp(if i % 2 == 0 { b } else { a });
            }
        });
        s.spawn(|| {
            for _ in 0..rounds {
                let got = m.pcp();
                assert!(got == a || got == b, "torn tuning {got:?}");
            }
        });
    });
}

/// Turning caching off is a barrier: when `set_pcp` returns, no frame is cached, and none gets
/// cached afterwards.
#[test]
fn turning_caches_off_empties_them() {
    let spec = Spec::uniform(1, 1024, 0);
    let mem = SparseMem::default();
    let m = spec.boot_with_cpus(&mem, &[n(0)]);
    let c = m.cpu(0).unwrap();
    let free = m.node(n(0)).unwrap().free_pages();
    let p = m.alloc_cpu(c, Order::ZERO, AllocFlags::empty()).unwrap();
    assert!(m.cached_pages() > 0);
    m.set_pcp(PcpConfig::OFF);
    assert_eq!(m.cached_pages(), 0, "set_pcp(OFF) drains the caches");
    m.free_cpu(c, p, Order::ZERO).unwrap();
    assert_eq!(m.cached_pages(), 0);
    assert_eq!(m.node(n(0)).unwrap().free_pages(), free);
    m.check_invariants().unwrap();
}

/// A walk that cannot use the cached frames (THISNODE on a memoryless node) does not drain every
/// CPU's cache on its way to failing.
#[test]
fn hopeless_walks_leave_caches_alone() {
    let mut spec = Spec::uniform(2, 1024, 0);
    spec.infos[1].has_memory = false;
    spec.ranges.pop();
    let mem = SparseMem::default();
    let m = spec.boot_with_cpus(&mem, &[n(0), n(1)]);
    let (c0, c1) = (m.cpu(0).unwrap(), m.cpu(1).unwrap());
    let p = m.alloc_cpu(c0, Order::ZERO, AllocFlags::empty()).unwrap();
    let cached = m.cached_pages();
    assert!(cached > 0);
    assert_eq!(m.alloc_cpu(c1, Order::ZERO, AllocFlags::THISNODE), None);
    assert_eq!(m.alloc(n(1), Order::ZERO, AllocFlags::THISNODE), None);
    assert_eq!(
        m.cached_pages(),
        cached,
        "node 0's frames cannot serve node 1 alone"
    );
    m.free_cpu(c0, p, Order::ZERO).unwrap();
    m.check_invariants().unwrap();
}

#[test]
fn a_free_of_another_spans_frame_in_a_lent_pageblock_goes_to_its_own_zone() {
    // Two nodes of 64 frames back to back share the pageblock [0, 512). Once CPU 0 is lent
    // node 0's part of it, a per-CPU free of a node-1 frame of the same pageblock must reach
    // node 1 (it was taken for the CPU's own and refused as foreign).
    let spec = Spec::uniform(2, 64, 0);
    let mem = SparseMem::default();
    let m = spec.boot_with_cpus(&mem, &[n(0)]);
    let c0 = m.cpu(0).unwrap();
    let mine = m.alloc_cpu(c0, Order::ZERO, AllocFlags::empty()).unwrap();
    assert_eq!(m.node_of(mine), Some(n(0)));
    let other = m.alloc(n(1), Order::ZERO, AllocFlags::THISNODE).unwrap();
    assert_eq!(m.node_of(other), Some(n(1)));
    assert_eq!(mine.get() >> 9, other.get() >> 9, "one pageblock");
    let free1 = m.node(n(1)).unwrap().free_pages();
    assert_eq!(m.free_cpu(c0, other, Order::ZERO), Ok(()));
    assert_eq!(m.node(n(1)).unwrap().free_pages(), free1 + 1);
    m.free_cpu(c0, mine, Order::ZERO).unwrap();
    m.drain_all();
    m.check_invariants().unwrap();
}

/// With memory nearly full no pageblock is worth lending, and a per-CPU allocation takes its
/// frame straight from the zone: the very frame the node API takes, in two machines that see
/// the same frees (a few frames free in every pageblock, then a random free and an
/// allocation, over and over: LLFree's "repeat").
#[test]
#[cfg_attr(miri, ignore = "thousands of allocations on two machines")]
fn a_per_cpu_allocation_with_nothing_worth_lending_takes_the_node_apis_frame() {
    let spec = Spec::uniform(1, 4096, 0);
    let (mem_a, mem_b) = (SparseMem::default(), SparseMem::default());
    let node_api = spec.boot_with_cpus(&mem_a, &[n(0)]);
    let per_cpu = spec.boot_with_cpus(&mem_b, &[n(0)]);
    let c0 = per_cpu.cpu(0).unwrap();
    let fill = |m: &Machine<'_>| -> Vec<Pfn> {
        core::iter::from_fn(|| m.alloc(n(0), Order::ZERO, AllocFlags::empty())).collect()
    };
    let (mut a, b) = (fill(&node_api), fill(&per_cpu));
    assert_eq!(a, b);
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = |len: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % len as u64) as usize
    };
    assert_eq!(node_api.node(n(0)).unwrap().free_pages(), 0);
    // Free frames per pageblock, kept below 16 so that none is worth lending: first about 1
    // frame in 128, 4 in a pageblock.
    let mut free = std::collections::BTreeMap::<u64, usize>::new();
    for _ in 0..a.len() / 128 {
        let p = a.swap_remove(next(a.len()));
        node_api.free(p, Order::ZERO).unwrap();
        per_cpu.free(p, Order::ZERO).unwrap();
        *free.entry(p.get() >> 9).or_default() += 1;
    }
    let free_in = |free: &std::collections::BTreeMap<u64, usize>, p: Pfn| {
        free.get(&(p.get() >> 9)).copied().unwrap_or(0)
    };
    let mut rounds = 0;
    while rounds < 2000 {
        let i = next(a.len());
        if free_in(&free, a[i]) >= 15 {
            continue;
        }
        node_api.free(a[i], Order::ZERO).unwrap();
        per_cpu.free_cpu(c0, a[i], Order::ZERO).unwrap();
        *free.entry(a[i].get() >> 9).or_default() += 1;
        let p = node_api
            .alloc(n(0), Order::ZERO, AllocFlags::empty())
            .unwrap();
        let q = per_cpu
            .alloc_cpu(c0, Order::ZERO, AllocFlags::empty())
            .unwrap();
        assert_eq!(p, q, "round {rounds}");
        // The placement rule itself: a frame of the fullest pageblock with a free one.
        let fullest = free.values().filter(|&&k| k > 0).min().copied();
        assert_eq!(Some(free_in(&free, p)), fullest, "round {rounds}");
        *free.entry(p.get() >> 9).or_default() -= 1;
        a[i] = p;
        rounds += 1;
    }
    assert_eq!(per_cpu.cached_pages(), 0, "nothing was lent");
    assert_eq!(
        node_api.node(n(0)).unwrap().free_pages(),
        per_cpu.node(n(0)).unwrap().free_pages()
    );
    node_api.free_bulk(&a).unwrap();
    per_cpu.free_bulk(&a).unwrap();
    node_api.check_invariants().unwrap();
    per_cpu.check_invariants().unwrap();
}
