//! Unit tests of the machine over mock memory: allocation, misuse, bulks, numastat,
//! watermarks, hot-add, huge pools, the zonelist hint and boot checks.
extern crate std;
use std::vec::Vec;

use super::{Machine, layout};
use crate::test_util::{SparseMem, Spec, for_many_machines, n};
use crate::zonelist::FallbackOptions;
use crate::*;

fn snapshot(m: &Machine<'_>) -> Vec<(u64, [u64; crate::addr::NR_ORDERS])> {
    m.nodes()
        .iter()
        .flat_map(|node| {
            ZoneKind::ALL.map(|k| (node.zone(k).counters().free, node.zone(k).buddyinfo()))
        })
        .collect()
}

for_many_machines!(exhaust_and_refill, |m| {
    let before = snapshot(&m);
    let total: u64 = m.nodes().iter().map(Node::managed_pages).sum();
    let mut got = Vec::new();
    while let Some(p) = m.alloc(n(0), Order::ZERO, AllocFlags::empty()) {
        got.push(p);
    }
    assert_eq!(
        got.len() as u64,
        total,
        "every managed frame is handed out once"
    );
    let mut sorted = got.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), got.len(), "no frame twice");
    m.check_invariants().unwrap();
    for p in got.iter().rev() {
        m.free(*p, Order::ZERO).unwrap();
    }
    m.check_invariants().unwrap();
    assert_eq!(snapshot(&m), before, "frees merge back to the boot blocks");
});

for_many_machines!(misuse_is_typed_and_changes_nothing, |m| {
    let p = m.alloc(n(0), Order::new(2), AllocFlags::empty()).unwrap();
    let before = snapshot(&m);
    assert_eq!(
        m.free(p, Order::new(1)),
        Err(FreeError::WrongOrder {
            pfn: p,
            given: Order::new(1),
            allocated: Order::new(2)
        })
    );
    assert_eq!(
        m.free(Pfn::new(p.get() + 1), Order::ZERO),
        Err(FreeError::NotAllocated {
            pfn: Pfn::new(p.get() + 1)
        })
    );
    assert_eq!(
        m.free(Pfn::new(p.get() + 1), Order::new(2)),
        Err(FreeError::Misaligned {
            pfn: Pfn::new(p.get() + 1),
            order: Order::new(2)
        })
    );
    assert_eq!(
        m.free(Pfn::new(1 << 40), Order::ZERO),
        Err(FreeError::Foreign {
            pfn: Pfn::new(1 << 40)
        })
    );
    assert_eq!(snapshot(&m), before);
    m.free(p, Order::new(2)).unwrap();
    let after = snapshot(&m);
    assert_eq!(
        m.free(p, Order::new(2)),
        Err(FreeError::DoubleFree { pfn: p })
    );
    assert_eq!(snapshot(&m), after);
    m.check_invariants().unwrap();
});

for_many_machines!(
    a_zone_short_of_its_marks_serves_again_after_a_bulk_free,
    |m| {
        // Exhausted down to its watermark, node 0's zones say so without their lock; a bulk free
        // (which holds the zone locks another way) must take that back.
        let mut got = Vec::new();
        while let Some(p) = m.alloc(n(0), Order::ZERO, AllocFlags::THISNODE) {
            got.push(p);
        }
        assert!(!got.is_empty());
        m.free_bulk(&got).unwrap();
        let mut again = Vec::new();
        while let Some(p) = m.alloc(n(0), Order::ZERO, AllocFlags::THISNODE) {
            again.push(p);
        }
        assert_eq!(
            again.len(),
            got.len(),
            "every frame the bulk freed serves again"
        );
        m.free_bulk(&again).unwrap();
        m.check_invariants().unwrap();
    }
);

for_many_machines!(bulk_round_trip, |m| {
    let before = snapshot(&m);
    let mut out = [Pfn::new(0); 300];
    let got = m.alloc_bulk(n(0), AllocFlags::empty(), &mut out);
    assert_eq!(got, 300);
    m.check_invariants().unwrap();
    let mut dup = out;
    dup[299] = dup[5];
    let mid = snapshot(&m);
    assert_eq!(
        m.free_bulk(&dup).unwrap_err(),
        BulkFreeError {
            index: 299,
            error: FreeError::Duplicate { pfn: out[5] }
        }
    );
    assert_eq!(snapshot(&m), mid, "a refused bulk free changes nothing");
    m.free_bulk(&out).unwrap();
    assert_eq!(snapshot(&m), before);
    m.check_invariants().unwrap();
});

#[test]
#[cfg_attr(
    miri,
    ignore = "walk logic over many allocations: the other machine tests take Miri through its unsafe code"
)]
fn fallback_counts_numastat() {
    let spec = Spec::uniform(2, 512, 0);
    let mem = SparseMem::default();
    let m = spec.boot(&mem);
    let mut frames = Vec::new();
    while let Some(p) = m.alloc(n(0), Order::ZERO, AllocFlags::empty()) {
        frames.push(p);
    }
    let s0 = m.numastat(n(0)).unwrap();
    let s1 = m.numastat(n(1)).unwrap();
    let on0 = m.node(n(0)).unwrap().managed_pages();
    let on1 = m.node(n(1)).unwrap().managed_pages();
    assert_eq!(
        (s0.numa_hit, s0.numa_foreign, s0.local_node),
        (on0, on1, on0)
    );
    assert_eq!((s1.numa_miss, s1.other_node, s1.numa_hit), (on1, on1, 0));
    assert!(
        frames[..on0 as usize]
            .iter()
            .all(|p| m.node_of(*p) == Some(n(0))),
        "local node first"
    );
    assert_eq!(m.alloc(n(0), Order::ZERO, AllocFlags::THISNODE), None);
}

#[test]
#[cfg_attr(
    miri,
    ignore = "walk logic over many allocations: the other machine tests take Miri through its unsafe code"
)]
fn watermarks_hold_back_memory_until_reserve() {
    let spec = Spec::uniform(1, 4096, 0);
    let mem = SparseMem::default();
    let topo = Topology::new(&spec.distances, &spec.infos).unwrap();
    let m = Machine::boot(
        topo,
        &mem,
        &spec.ranges,
        BootOptions {
            min_free_kbytes: Some(4 * 400),
            ..BootOptions::default()
        },
    )
    .unwrap();
    let marks = m.node(n(0)).unwrap().zone(ZoneKind::Dma32).counters().marks;
    assert!(marks.min > 0 && marks.low > marks.min);
    let mut count = 0;
    while m.alloc(n(0), Order::ZERO, AllocFlags::empty()).is_some() {
        count += 1;
    }
    let free = m.node(n(0)).unwrap().free_pages();
    assert_eq!(free, marks.min, "the second pass stops at min");
    assert!(m.alloc(n(0), Order::ZERO, AllocFlags::RESERVE).is_some());
    assert!(count > 0);
}

/// Frames per MiB.
const MIB: u64 = 256;
/// The first frame above 4 GiB.
const FOUR_GIB: u64 = 1 << 20;

/// Linux's `setup_per_zone_lowmem_reserve()` for a node's `Dma32` zone, transcribed: the
/// managed pages of the zones above it over the ratio, none with a ratio of 0 or an empty
/// zone.
fn lowmem_reserve(ratio: u32, dma32_managed: u64, normal_managed: u64) -> u64 {
    if ratio == 0 || dma32_managed == 0 {
        0
    } else {
        normal_managed / u64::from(ratio)
    }
}

/// Boots `spec` with `min_free_kbytes` (0: min watermark 0) and `Dma32`'s protection at `ratio`.
fn boot_protected<'a>(
    spec: &'a Spec,
    mem: &'a SparseMem,
    min_free_kbytes: u64,
    ratio: u32,
) -> Machine<'a> {
    let topo = Topology::new(&spec.distances, &spec.infos).unwrap();
    let opts = BootOptions {
        min_free_kbytes: Some(min_free_kbytes),
        lowmem_reserve_ratio: ratio,
        hotplug_slots: 4,
        cpus: &[NodeId::new(0)],
        ..BootOptions::default()
    };
    Machine::boot(topo, mem, &spec.ranges, opts).unwrap()
}

/// Allocates with `flags` on `node` until nothing is left, largest blocks first (a few dozen
/// allocations empty a node, which keeps Miri quick); returns the blocks.
fn empty_node(m: &Machine<'_>, node: NodeId, flags: AllocFlags) -> Vec<(Pfn, Order)> {
    let mut blocks = Vec::new();
    for k in (0..=10).rev() {
        while let Some(p) = m.alloc(node, Order::new(k), flags) {
            blocks.push((p, Order::new(k)));
        }
    }
    blocks
}

/// Allocates with `flags` on node 0 until nothing is left; returns the frames.
fn exhaust(m: &Machine<'_>, flags: AllocFlags) -> Vec<Pfn> {
    let mut got = Vec::new();
    let mut buf = [Pfn::new(0); 4096];
    loop {
        let k = m.alloc_bulk(n(0), flags | AllocFlags::THISNODE, &mut buf);
        got.extend_from_slice(&buf[..k]);
        if k == 0 {
            return got;
        }
    }
}

#[test]
#[cfg_attr(
    miri,
    ignore = "allocates 80,000 frames: the other machine tests take Miri through its unsafe code"
)]
fn dma32_keeps_its_protection_from_allocations_that_may_use_normal() {
    // One node: 64 MiB below 4 GiB, 256 MiB above.
    let spec = Spec::uniform(1, 320 * MIB, FOUR_GIB - 64 * MIB);
    for ratio in [256, 32, 0] {
        let mem = SparseMem::default();
        let m = boot_protected(&spec, &mem, 0, ratio);
        let node = m.node(n(0)).unwrap();
        let (dma32, normal) = (node.zone(ZoneKind::Dma32), node.zone(ZoneKind::Normal));
        let want = lowmem_reserve(ratio, dma32.counters().managed, normal.counters().managed);
        assert_eq!(dma32.counters().marks.protection, want, "ratio {ratio}");
        assert_eq!(normal.counters().marks.protection, 0);
        if ratio != 0 {
            assert!(want > 0);
        }
        // Ordinary allocations take all of Normal and leave Dma32 its protection, single
        // frames and blocks alike.
        let mut held = exhaust(&m, AllocFlags::empty());
        assert_eq!(normal.counters().free, 0);
        assert_eq!(dma32.counters().free, want, "ratio {ratio}");
        assert_eq!(m.alloc(n(0), Order::ZERO, AllocFlags::empty()), None);
        assert_eq!(m.alloc(n(0), Order::new(1), AllocFlags::empty()), None);
        let cpu = m.cpu(0).unwrap();
        assert_eq!(m.alloc_cpu(cpu, Order::ZERO, AllocFlags::empty()), None);
        if want > 0 {
            // A DMA32 request through the CPU's cache takes a protected frame, but no
            // pageblock of them goes into the cache, where ordinary requests would find it.
            let d = m.alloc_cpu(cpu, Order::ZERO, AllocFlags::DMA32).unwrap();
            assert_eq!(m.cached_pages(), 0);
            assert_eq!(dma32.counters().free, want - 1);
            assert_eq!(m.alloc_cpu(cpu, Order::ZERO, AllocFlags::empty()), None);
            m.free(d, Order::ZERO).unwrap();
        }
        // Requests for memory below 4 GiB may use it, and so may the reserves.
        let mut dma = exhaust(&m, AllocFlags::DMA32);
        assert_eq!(dma.len() as u64, want);
        assert_eq!(dma32.counters().free, 0);
        if let Some(p) = dma.pop() {
            m.free(p, Order::ZERO).unwrap();
            assert_eq!(m.alloc(n(0), Order::ZERO, AllocFlags::empty()), None);
            assert_eq!(m.alloc_cpu(cpu, Order::ZERO, AllocFlags::empty()), None);
            held.push(m.alloc(n(0), Order::ZERO, AllocFlags::RESERVE).unwrap());
        }
        m.check_invariants().unwrap();
        m.free_bulk(&held).unwrap();
        m.free_bulk(&dma).unwrap();
        m.check_invariants().unwrap();
    }
}

#[test]
#[cfg_attr(
    miri,
    ignore = "allocates 80,000 frames: the other machine tests take Miri through its unsafe code"
)]
fn the_protection_adds_to_the_min_watermark() {
    let spec = Spec::uniform(1, 320 * MIB, FOUR_GIB - 64 * MIB);
    let mem = SparseMem::default();
    let m = boot_protected(&spec, &mem, 8 * 1024, 256);
    let node = m.node(n(0)).unwrap();
    let (dma32, normal) = (node.zone(ZoneKind::Dma32), node.zone(ZoneKind::Normal));
    let want = lowmem_reserve(256, dma32.counters().managed, normal.counters().managed);
    let marks = dma32.counters().marks;
    assert!(marks.min > 0 && marks.low > marks.min && want > 0);
    assert_eq!(marks.protection, want);
    // The last pass of an ordinary walk keeps min, and Dma32 its protection on top of it.
    let mut held = exhaust(&m, AllocFlags::empty());
    assert_eq!(normal.counters().free, normal.counters().marks.min);
    assert_eq!(dma32.counters().free, marks.min + want);
    // One frame above that serves a single frame, not a pair.
    let i = held.iter().position(|p| p.get() < FOUR_GIB).unwrap();
    m.free(held.swap_remove(i), Order::ZERO).unwrap();
    assert_eq!(m.alloc(n(0), Order::new(1), AllocFlags::empty()), None);
    held.push(m.alloc(n(0), Order::ZERO, AllocFlags::empty()).unwrap());
    assert_eq!(dma32.counters().free, marks.min + want);
    // A DMA32 request keeps only the watermark.
    let dma = exhaust(&m, AllocFlags::DMA32);
    assert_eq!(dma.len() as u64, want);
    m.free_bulk(&held).unwrap();
    m.free_bulk(&dma).unwrap();
    m.check_invariants().unwrap();
}

#[test]
fn hot_adding_normal_memory_raises_the_protection_of_dma32() {
    // All of node 0 below 4 GiB at boot: nothing above it to protect from.
    let spec = Spec::uniform(1, 64 * MIB, FOUR_GIB - 64 * MIB);
    let mem = SparseMem::default();
    let m = boot_protected(&spec, &mem, 0, 256);
    let node = m.node(n(0)).unwrap();
    let (dma32, normal) = (node.zone(ZoneKind::Dma32), node.zone(ZoneKind::Normal));
    assert_eq!(dma32.counters().marks.protection, 0);
    let added = PhysRange::new(Pfn::new(FOUR_GIB), Pfn::new(FOUR_GIB + 512 * MIB)).unwrap();
    m.hot_add(&mem, n(0), added, FallbackOptions::default())
        .unwrap();
    let want = lowmem_reserve(256, dma32.counters().managed, normal.counters().managed);
    assert!(want >= 512 * MIB / 256 - 8, "{want}");
    assert_eq!(dma32.counters().marks.protection, want);
    // Offlining it again takes the protection back.
    m.offline(&mem, added, OfflineOptions::default()).unwrap();
    assert_eq!(dma32.counters().marks.protection, 0);
    m.check_invariants().unwrap();
}

#[test]
fn hot_add_joins_a_memoryless_node() {
    let mut spec = Spec::uniform(3, 1024, 0);
    spec.infos[2].has_memory = false;
    spec.ranges.pop();
    let mem = SparseMem::default();
    let m = spec.boot(&mem);
    let mut row = [NodeId::default(); 3];
    assert_eq!(m.fallback_order(n(2), &mut row), 2);
    assert_eq!(m.alloc(n(2), Order::ZERO, AllocFlags::THISNODE), None);
    let r = PhysRange::new(Pfn::new(1 << 21), Pfn::new((1 << 21) + 2048)).unwrap();
    assert_eq!(
        m.hot_add(&mem, n(5), r, FallbackOptions::default()),
        Err(BootError::UnknownNode { node: n(5) })
    );
    let overlap = PhysRange::new(Pfn::new(1000), Pfn::new(3000)).unwrap();
    assert_eq!(
        m.hot_add(&mem, n(2), overlap, FallbackOptions::default()),
        Err(BootError::Overlap {
            start: Pfn::new(1000)
        })
    );
    m.hot_add(&mem, n(2), r, FallbackOptions::default())
        .unwrap();
    assert_eq!(m.fallback_order(n(2), &mut row), 3);
    assert_eq!(row[0], n(2));
    assert_eq!(m.fallback_order(n(0), &mut row), 3);
    let p = m.alloc(n(2), Order::ZERO, AllocFlags::THISNODE).unwrap();
    assert_eq!(m.node_of(p), Some(n(2)));
    m.free(p, Order::ZERO).unwrap();
    m.check_invariants().unwrap();
}

#[test]
fn huge_pools_reserve_hand_out_and_refuse_misuse() {
    let spec = Spec::uniform(2, 4 * 512 + 600, 0);
    let mem = SparseMem::default();
    let m = spec.boot(&mem);
    let before = snapshot(&m);
    assert_eq!(
        m.reserve_huge(n(1), HugeSize::Size2M, 10),
        4,
        "node 1 holds four aligned 2 MiB blocks"
    );
    assert_eq!(
        m.huge_counts(n(1), HugeSize::Size2M),
        HugeCounts { total: 4, free: 4 }
    );
    assert_eq!(m.reserve_huge(n(0), HugeSize::Size1G, 1), 0);
    m.check_invariants().unwrap();
    let p = m.alloc_huge(n(1), HugeSize::Size2M).unwrap();
    assert_eq!(m.node_of(p), Some(n(1)));
    assert_eq!(
        m.huge_counts(n(1), HugeSize::Size2M),
        HugeCounts { total: 4, free: 3 }
    );
    assert_eq!(
        m.free(p, Order::HUGE_2M),
        Err(FreeError::HugePage { pfn: p })
    );
    assert_eq!(
        m.free_huge(Pfn::new(p.get() + 1), HugeSize::Size2M),
        Err(FreeError::Misaligned {
            pfn: Pfn::new(p.get() + 1),
            order: Order::HUGE_2M
        })
    );
    m.free_huge(p, HugeSize::Size2M).unwrap();
    assert_eq!(
        m.free_huge(p, HugeSize::Size2M),
        Err(FreeError::DoubleFree { pfn: p })
    );
    let small = m.alloc(n(0), Order::HUGE_2M, AllocFlags::empty()).unwrap();
    assert_eq!(
        m.free_huge(small, HugeSize::Size2M),
        Err(FreeError::NotAllocated { pfn: small })
    );
    m.free(small, Order::HUGE_2M).unwrap();
    m.check_invariants().unwrap();
    // Node 0's pool is empty: the walk falls back to node 1's pool.
    let q = m.alloc_huge(n(0), HugeSize::Size2M).unwrap();
    assert_eq!(m.node_of(q), Some(n(1)));
    m.free_huge(q, HugeSize::Size2M).unwrap();
    assert_eq!(m.release_huge(n(1), HugeSize::Size2M, 99), 4);
    m.check_invariants().unwrap();
    assert_eq!(snapshot(&m), before, "released pages merge back");
}

/// Node 0's fallback order of the 4-node `m`, once every frame of its first three nodes is
/// handed out (returned with it).
fn exhaust_the_first_three(m: &Machine<'_>) -> ([NodeId; 4], Vec<Pfn>) {
    let mut row = [NodeId::default(); 4];
    assert_eq!(m.fallback_order(n(0), &mut row), 4);
    let mut held = Vec::new();
    for &node in &row[..3] {
        while let Some(p) = m.alloc(node, Order::ZERO, AllocFlags::THISNODE) {
            held.push(p);
        }
    }
    (row, held)
}

/// Allocates order-0 frames for node 0 until one comes from `nearest`, keeping the others in
/// `held`; fails if that takes more than `HINT_BUDGET` allocations.
fn nearest_within_the_budget(m: &Machine<'_>, nearest: NodeId, held: &mut Vec<Pfn>) {
    for steps in 1.. {
        let q = m.alloc(n(0), Order::ZERO, AllocFlags::empty()).unwrap();
        if m.node_of(q) == Some(nearest) {
            return;
        }
        held.push(q);
        assert!(
            steps <= crate::node::HINT_BUDGET,
            "node {nearest}'s free memory was passed over for {steps} allocations"
        );
    }
}

#[test]
#[cfg_attr(
    miri,
    ignore = "walk logic over many allocations: the other machine tests take Miri through its unsafe code"
)]
fn hint_skips_exhausted_prefix_but_never_fails_a_full_walk() {
    let spec = Spec::uniform(4, 600, 0);
    let mem = SparseMem::default();
    let m = spec.boot(&mem);
    // Exhaust the first three nodes of node 0's list for order 0.
    let (row, mut held) = exhaust_the_first_three(&m);
    let p = m.alloc(n(0), Order::ZERO, AllocFlags::empty()).unwrap();
    assert_eq!(m.node_of(p), Some(row[3]));
    let generation = layout::Layout::generation(m.layout.begin());
    let start = m.node(n(0)).unwrap().hint(Order::ZERO).begin(generation);
    assert_eq!(start, 3, "the hint skips the exhausted prefix");
    // Memory returns to the nearest node: within HINT_BUDGET allocations the walk finds it.
    let back = held
        .iter()
        .position(|p| m.node_of(*p) == Some(row[0]))
        .unwrap();
    m.free(held.swap_remove(back), Order::ZERO).unwrap();
    nearest_within_the_budget(&m, row[0], &mut held);
    // Exhaust the last node too: a hinted walk must still find memory in the prefix.
    while let Some(q) = m.alloc(row[3], Order::ZERO, AllocFlags::THISNODE) {
        held.push(q);
    }
    m.free(held.swap_remove(0), Order::ZERO).unwrap();
    assert!(
        m.alloc(n(0), Order::ZERO, AllocFlags::empty()).is_some(),
        "the hint never makes a walk fail"
    );
    // Hints are per order: an order-5 failure leaves the order-0 hint alone.
    assert!(m.alloc(n(0), Order::new(5), AllocFlags::empty()).is_none());
}

#[test]
#[cfg_attr(
    miri,
    ignore = "walk logic over many allocations: the other machine tests take Miri through its unsafe code"
)]
fn a_walk_below_the_low_watermark_skips_its_first_try_until_one_succeeds_above_it() {
    let spec = Spec::uniform(1, 1 << 16, 0);
    let mem = SparseMem::default();
    let m = spec.boot(&mem);
    let hint = m.node(n(0)).unwrap().hint(Order::ZERO);
    let mut held = Vec::new();
    let mut first_marked = None;
    while let Some(p) = m.alloc(n(0), Order::ZERO, AllocFlags::empty()) {
        held.push(p);
        if !hint.idle() && first_marked.is_none() {
            first_marked = Some(held.len());
        }
    }
    let marked = first_marked.expect("walks reached the low watermark");
    assert!(
        marked < held.len(),
        "walks below the low watermark go on without the first try ({marked} of {})",
        held.len()
    );
    // Every frame of the node still comes out.
    while let Some(p) = m.alloc(n(0), Order::ZERO, AllocFlags::RESERVE) {
        held.push(p);
    }
    assert_eq!(m.node(n(0)).unwrap().free_pages(), 0);
    assert!(
        !hint.idle(),
        "the walks below the low watermark keep the mark"
    );
    for p in held.drain(..) {
        m.free(p, Order::ZERO).unwrap();
    }
    assert!(!hint.idle(), "frees leave the mark alone");
    let p = m.alloc(n(0), Order::ZERO, AllocFlags::empty()).unwrap();
    assert!(
        hint.idle(),
        "a walk that succeeds first time above the mark clears it"
    );
    m.free(p, Order::ZERO).unwrap();
    m.check_invariants().unwrap();
}

/// A node with both zones: once `Normal` is below its low watermark, `Dma32` serves every
/// allocation at entry 0, and the mark must stay (a walk that succeeds at entry 0 only after
/// passing over a zone does not clear it), or every allocation would try `Normal` twice.
#[test]
#[cfg_attr(
    miri,
    ignore = "walk logic over many allocations: the other machine tests take Miri through its unsafe code"
)]
fn the_mark_stays_while_the_second_zone_of_the_first_node_serves() {
    // 128 MiB below 4 GiB (Dma32) and 128 MiB above it (Normal).
    let spec = Spec::uniform(1, 1 << 16, (1 << 20) - (1 << 15));
    let mem = SparseMem::default();
    let m = spec.boot(&mem);
    let hint = m.node(n(0)).unwrap().hint(Order::ZERO);
    let mut held = Vec::new();
    while hint.idle() {
        held.push(m.alloc(n(0), Order::ZERO, AllocFlags::empty()).unwrap());
    }
    for _ in 0..64 {
        let p = m.alloc(n(0), Order::ZERO, AllocFlags::empty()).unwrap();
        assert!(
            p.get() < 1 << 20,
            "Dma32 serves once Normal is below its watermark"
        );
        held.push(p);
        assert!(!hint.idle(), "a walk served by Dma32 keeps the mark");
    }
    for p in held {
        m.free(p, Order::ZERO).unwrap();
    }
    m.check_invariants().unwrap();
}

#[test]
fn boot_rejects_bad_layouts() {
    let mut spec = Spec::uniform(2, 1024, 0);
    spec.ranges[1].range = PhysRange::new(Pfn::new(1000), spec.ranges[1].range.end()).unwrap();
    let mem = SparseMem::default();
    let topo = Topology::new(&spec.distances, &spec.infos).unwrap();
    assert_eq!(
        Machine::boot(topo, &mem, &spec.ranges, BootOptions::default()).unwrap_err(),
        BootError::Overlap {
            start: Pfn::new(1000)
        }
    );
    let spec = Spec::uniform(2, 1024, 0);
    let topo = Topology::new(&spec.distances, &spec.infos).unwrap();
    assert_eq!(
        Machine::boot(topo, &mem, &spec.ranges[..1], BootOptions::default()).unwrap_err(),
        BootError::MemoryStateMismatch { node: n(1) }
    );
    let tiny = [
        MemoryRange {
            node: n(0),
            range: PhysRange::new(Pfn::new(0), Pfn::new(1)).unwrap(),
        },
        spec.ranges[1],
    ];
    assert_eq!(
        Machine::boot(topo, &mem, &tiny, BootOptions::default()).unwrap_err(),
        BootError::BadRange { start: Pfn::new(0) }
    );
}

#[test]
fn drain_all_merges_free_memory_back_to_its_boot_blocks() {
    // Freeing a pageblock's last frame keeps it split as its class's spare; after `drain_all`
    // nothing may stay split, so the free blocks are those of boot again.
    let spec = Spec::uniform(1, 8 * 512, 0);
    let mem = SparseMem::default();
    let m = spec.boot(&mem);
    let before = snapshot(&m);
    let held: Vec<Pfn> = (0..1200)
        .map(|_| m.alloc(n(0), Order::ZERO, AllocFlags::empty()).unwrap())
        .collect();
    for p in held {
        m.free(p, Order::ZERO).unwrap();
    }
    m.drain_all();
    m.check_invariants().unwrap();
    assert_eq!(snapshot(&m), before);
}

/// Nodes whose tables are carved alike get different cache colours: no two of the first 32
/// share the offset of their `Node` within a page, so the zones a walk reads do not all fall
/// in one cache set.
#[test]
#[cfg_attr(
    miri,
    ignore = "a boot of 32 nodes: the other machine tests take Miri through its unsafe code"
)]
fn each_nodes_tables_sit_at_a_page_offset_of_their_own() {
    let spec = Spec::uniform(32, 2048, 0);
    let mem = SparseMem::default();
    let m = spec.boot(&mem);
    let mut offsets: Vec<usize> = (0..32)
        .map(|i| core::ptr::from_ref(m.node(n(i)).unwrap()).addr() % 4096)
        .collect();
    offsets.sort_unstable();
    offsets.dedup();
    assert_eq!(offsets.len(), 32);
}

/// Linux's `__alloc_pages_slowpath`, transcribed as the oracle: once an allocation may ignore
/// the watermarks (ALLOC_NO_WATERMARKS), "Reset the nodemask and zonelist iterators if memory
/// policies can be ignored": the pass without watermarks walks the whole local zonelist, outside
/// an `MPOL_BIND` mask. Without RESERVE the mask holds, and an empty bound node fails.
#[test]
fn reserve_under_bind_leaves_the_mask_as_linux_does() {
    let spec = Spec::uniform(2, 4096, 0);
    let mem = SparseMem::default();
    let m = spec.boot(&mem);
    let blocks = empty_node(&m, n(1), AllocFlags::THISNODE | AllocFlags::RESERVE);
    let mut held = Vec::new();
    assert_eq!(m.node(n(1)).unwrap().free_pages(), 0);
    assert!(m.node(n(0)).unwrap().free_pages() > 0);
    let mut bind1 = crate::policy::TaskPolicy::new(
        &m,
        crate::policy::Policy::Bind(NodeMask::single(n(1))),
        false,
    )
    .unwrap();
    assert_eq!(
        bind1.alloc(&m, n(1), Order::ZERO, AllocFlags::empty()),
        None
    );
    let mut out = [Pfn::new(0); 4];
    assert_eq!(
        bind1
            .alloc_bulk(&m, n(1), AllocFlags::empty(), &mut out)
            .placed,
        0
    );
    let p = bind1
        .alloc(&m, n(1), Order::ZERO, AllocFlags::RESERVE)
        .expect("the reserve pass ignores the mask");
    assert_eq!(m.node_of(p), Some(n(0)));
    held.push(p);
    let got = bind1
        .alloc_bulk(&m, n(1), AllocFlags::RESERVE, &mut out)
        .placed;
    assert_eq!(got, out.len());
    assert!(out.iter().all(|q| m.node_of(*q) == Some(n(0))));
    held.extend_from_slice(&out);
    m.free_bulk(&held).unwrap();
    for (p, order) in blocks {
        m.free(p, order).unwrap();
    }
    m.check_invariants().unwrap();
}

/// A request the machine refuses before it takes anything (`ZERO` without a clearer) leaves
/// an interleave policy's cursor where it was: a failed call changes nothing.
#[test]
fn a_refused_interleave_request_leaves_the_cursor() {
    use crate::policy::{Policy, TaskPolicy};
    let spec = Spec::uniform(2, 4096, 0);
    let mem = SparseMem::default();
    let m = spec.boot(&mem);
    let mask = NodeMask::from_nodes([n(0), n(1)]);
    let mut t = TaskPolicy::new(&m, Policy::Interleave(mask), false).unwrap();
    let start = t.il_state();
    let mut out = [Pfn::new(0); 3];
    let r = t.alloc_bulk(&m, n(0), AllocFlags::ZERO, &mut out);
    assert_eq!(r.placed, 0);
    assert_eq!(t.il_state(), start, "bulk: a refused call moved the cursor");
    assert_eq!(t.alloc(&m, n(0), Order::ZERO, AllocFlags::ZERO), None);
    assert_eq!(
        t.il_state(),
        start,
        "single: a refused call moved the cursor"
    );
    // The pools' walk too (the `x86_64` frame allocator passes its flags to it).
    assert_eq!(m.reserve_huge(n(0), HugeSize::Size2M, 1), 1);
    assert_eq!(m.reserve_huge(n(1), HugeSize::Size2M, 1), 1);
    let huge = t.alloc_huge_with(&m, n(0), HugeSize::Size2M, AllocFlags::ZERO);
    assert_eq!(huge, None);
    assert_eq!(t.il_state(), start, "huge: a refused call moved the cursor");
}

/// Nodes 0 and 1 with 4096 frames each, and node 2 with CPUs and no memory, next to node 1.
fn two_nodes_and_a_memoryless_one() -> Spec {
    let mut spec = Spec::uniform(2, 4096, 0);
    spec.distances = std::vec![10, 20, 20, 20, 10, 12, 20, 12, 10];
    spec.infos.push(NodeInfo {
        has_cpus: true,
        has_memory: false,
        ..NodeInfo::default()
    });
    spec
}

/// Linux builds an interleave policy's nodes as the mask given ∩ `N_MEMORY`
/// (`mpol_set_nodemask`), so `weighted_interleave_nodes()` never picks a node without memory
/// and no page of an interleave lands outside the mask while the mask's nodes have memory.
#[test]
fn interleave_skips_nodes_without_memory_as_linux_does() {
    use crate::policy::{Policy, TaskPolicy};
    let spec = two_nodes_and_a_memoryless_one();
    let mem = SparseMem::default();
    let m = spec.boot(&mem);
    let mask = NodeMask::from_nodes([n(0), n(2)]);
    for policy in [Policy::Interleave(mask), Policy::WeightedInterleave(mask)] {
        let mut t = TaskPolicy::new(&m, policy, false).unwrap();
        let mut out = [Pfn::new(0); 8];
        let r = t.alloc_bulk(&m, n(0), AllocFlags::empty(), &mut out);
        assert_eq!(r.placed, 8);
        let mut single = Vec::new();
        for _ in 0..8 {
            single.push(t.alloc(&m, n(0), Order::ZERO, AllocFlags::empty()).unwrap());
        }
        let nodes: Vec<usize> = out
            .iter()
            .chain(&single)
            .map(|&p| m.node_of(p).unwrap().index())
            .collect();
        m.free_bulk(&out).unwrap();
        m.free_bulk(&single).unwrap();
        assert!(
            nodes.iter().all(|&k| k == 0),
            "{policy:?}: pages on nodes {nodes:?}, Linux: all on node 0"
        );
    }
}
// Linux's `zone_statistics()` compares the landing zone's node with the node of
// `ac->preferred_zoneref`, which `finalise_ac()` sets to `first_zones_zonelist(zonelist,
// highest_zoneidx, nodemask)`: the first zone of the walk that the request may use ("The
// preferred zone is used for statistics"). So an `MPOL_BIND` allocation from a CPU outside
// the mask that lands on the mask's first node is a `numa_hit` there (`numactl --membind=1`
// on node 0 counts hits on node 1, never misses); a CPU of a memoryless node prefers its
// nearest node with memory (its zonelist has no zone of its own); and a `GFP_DMA32` request
// from a node without `Dma32` memory prefers the first node that has some.

/// numastat deltas `[hit, miss, foreign, local, other]` from `a` to `b`.
fn delta(a: NumaStat, b: NumaStat) -> [u64; 5] {
    [
        b.numa_hit - a.numa_hit,
        b.numa_miss - a.numa_miss,
        b.numa_foreign - a.numa_foreign,
        b.local_node - a.local_node,
        b.other_node - a.other_node,
    ]
}

/// (a) Bind({1}) from a CPU of node 0, with node 1 free: Linux counts a hit on node 1 (and
/// `other_node`), nothing on node 0.
#[test]
fn numastat_bind_outside_the_cpus_node_counts_hits() {
    use crate::policy::{Policy, TaskPolicy};
    let d = delta;
    let spec = Spec::uniform(2, 2048, 0);
    let mem = SparseMem::default();
    let m = spec.boot(&mem);
    let (b0, b1) = (m.numastat(n(0)).unwrap(), m.numastat(n(1)).unwrap());
    let mut bind = TaskPolicy::new(&m, Policy::Bind(NodeMask::from_nodes([n(1)])), false).unwrap();
    let p = bind
        .alloc(&m, n(0), Order::ZERO, AllocFlags::empty())
        .unwrap();
    assert_eq!(m.node_of(p), Some(n(1)));
    let (a0, a1) = (m.numastat(n(0)).unwrap(), m.numastat(n(1)).unwrap());
    // hit, miss, foreign, local, other
    assert_eq!(
        d(b1, a1),
        [1, 0, 0, 0, 1],
        "bind: node 1 as Linux counts it"
    );
    assert_eq!(
        d(b0, a0),
        [0, 0, 0, 0, 0],
        "bind: node 0 as Linux counts it"
    );
}

/// (b) A CPU of memoryless node 2: its zonelist has no zone of its own, so its preferred
/// zone is its nearest node with memory, where its allocations are hits.
#[test]
fn numastat_memoryless_cpu_node_counts_hits_on_its_nearest_node() {
    let d = delta;
    let mut spec = Spec::uniform(3, 2048, 0);
    spec.infos[2].has_memory = false;
    spec.ranges.pop();
    let mem = SparseMem::default();
    let m = spec.boot_with_cpus(&mem, &[n(2)]);
    let mut row = [NodeId::default(); 3];
    m.fallback_order(n(2), &mut row);
    let first = row[0];
    let before: Vec<NumaStat> = (0..3).map(|i| m.numastat(n(i)).unwrap()).collect();
    let p = m
        .alloc_cpu(m.cpu(0).unwrap(), Order::ZERO, AllocFlags::empty())
        .unwrap();
    assert_eq!(m.node_of(p), Some(first));
    let q = m.alloc(n(2), Order::ZERO, AllocFlags::empty()).unwrap();
    assert_eq!(m.node_of(q), Some(first));
    let after: Vec<NumaStat> = (0..3).map(|i| m.numastat(n(i)).unwrap()).collect();
    assert_eq!(
        d(before[first.index()], after[first.index()]),
        [2, 0, 0, 0, 2],
        "memoryless CPU node: hits on its nearest node with memory"
    );
    assert_eq!(
        d(before[2], after[2]),
        [0, 0, 0, 0, 0],
        "a memoryless node is never anyone's preferred zone"
    );
}

/// (c) A DMA32 request from node 1, all of whose memory is above 4 GiB: node 0's `Dma32` is
/// the first zone it may use (`highest_zoneidx` is DMA32), so it is a hit there.
#[test]
fn numastat_dma32_from_a_node_without_dma32_counts_a_hit() {
    let d = delta;
    let spec = Spec::uniform(2, 600, (1 << 20) - 600);
    let mem = SparseMem::default();
    let m = spec.boot(&mem);
    assert_eq!(
        m.node(n(1))
            .unwrap()
            .zone(ZoneKind::Dma32)
            .counters()
            .managed,
        0
    );
    let (b0, b1) = (m.numastat(n(0)).unwrap(), m.numastat(n(1)).unwrap());
    let p = m.alloc(n(1), Order::ZERO, AllocFlags::DMA32).unwrap();
    assert_eq!(m.node_of(p), Some(n(0)));
    let (a0, a1) = (m.numastat(n(0)).unwrap(), m.numastat(n(1)).unwrap());
    assert_eq!(d(b0, a0), [1, 0, 0, 0, 1], "DMA32: a hit on node 0");
    assert_eq!(d(b1, a1), [0, 0, 0, 0, 0], "DMA32: nothing on node 1");
}

/// (d) Linux's `__alloc_pages_slowpath()` resets the nodemask once an allocation may ignore the
/// watermarks and recomputes the preferred zone from the whole zonelist
/// (`ac->preferred_zoneref = first_zones_zonelist(ac->zonelist, ac->highest_zoneidx, NULL)`).
/// So a `RESERVE` allocation under `Bind({1})` from a CPU of node 0, with node 0 empty and
/// node 1 below min, that the pass without watermarks serves on node 1 prefers node 0 (the
/// first zone of its whole list): a miss on node 1 and a foreign on node 0, not a hit. A
/// single allocation and a bulk count alike.
#[test]
fn numastat_reserve_pass_under_bind_counts_against_the_whole_zonelist() {
    use crate::policy::{Policy, TaskPolicy};
    let d = delta;
    let spec = Spec::uniform(2, 4096, 0);
    let mem = SparseMem::default();
    let m = boot_protected(&spec, &mem, 4 * 400, 0);
    let mut blocks = empty_node(&m, n(0), AllocFlags::THISNODE | AllocFlags::RESERVE);
    blocks.extend(empty_node(&m, n(1), AllocFlags::THISNODE));
    let mut held = Vec::new();
    assert_eq!(m.node(n(0)).unwrap().free_pages(), 0);
    assert!(m.node(n(1)).unwrap().free_pages() >= 4);
    let mut bind1 = TaskPolicy::new(&m, Policy::Bind(NodeMask::single(n(1))), false).unwrap();
    let (b0, b1) = (m.numastat(n(0)).unwrap(), m.numastat(n(1)).unwrap());
    let p = bind1
        .alloc(&m, n(0), Order::ZERO, AllocFlags::RESERVE)
        .unwrap();
    assert_eq!(m.node_of(p), Some(n(1)));
    held.push(p);
    let mut out = [Pfn::new(0); 3];
    let got = bind1
        .alloc_bulk(&m, n(0), AllocFlags::RESERVE, &mut out)
        .placed;
    assert_eq!(got, 3);
    assert!(out.iter().all(|q| m.node_of(*q) == Some(n(1))));
    held.extend_from_slice(&out);
    let (a0, a1) = (m.numastat(n(0)).unwrap(), m.numastat(n(1)).unwrap());
    assert_eq!(
        d(b1, a1),
        [0, 4, 0, 0, 4],
        "reserve under bind: misses on node 1"
    );
    assert_eq!(
        d(b0, a0),
        [0, 0, 4, 0, 0],
        "reserve under bind: foreign on node 0"
    );
    m.free_bulk(&held).unwrap();
    for (p, order) in blocks {
        m.free(p, order).unwrap();
    }
    m.check_invariants().unwrap();
}

/// An interleave's nodes follow the layout: a node of the mask that gains memory by a hot-add
/// takes its turns from then on (the policy's cached nodes with memory lapse with the layout).
#[test]
fn interleave_takes_in_a_node_once_it_gains_memory() {
    use crate::policy::{Policy, TaskPolicy};
    let spec = two_nodes_and_a_memoryless_one();
    let mem = SparseMem::default();
    let m = spec.boot(&mem);
    let mut t = TaskPolicy::new(
        &m,
        Policy::Interleave(NodeMask::from_nodes([n(0), n(2)])),
        false,
    )
    .unwrap();
    let mut held = Vec::new();
    let nodes_of = |t: &mut TaskPolicy, held: &mut Vec<Pfn>| -> Vec<usize> {
        (0..4)
            .map(|_| {
                let p = t.alloc(&m, n(0), Order::ZERO, AllocFlags::empty()).unwrap();
                held.push(p);
                m.node_of(p).unwrap().index()
            })
            .collect()
    };
    assert_eq!(nodes_of(&mut t, &mut held), [0, 0, 0, 0]);
    let added = PhysRange::new(Pfn::new(1 << 20), Pfn::new((1 << 20) + 4096)).unwrap();
    m.hot_add(&mem, n(2), added, FallbackOptions::default())
        .unwrap();
    let after = nodes_of(&mut t, &mut held);
    assert_eq!(after.iter().filter(|&&k| k == 2).count(), 2, "{after:?}");
    m.free_bulk(&held).unwrap();
    m.check_invariants().unwrap();
}

/// A free of a free frame a background scrub holds is a double free (`docs/promises.md`: "the
/// held unit is allocated to every other path"), in the pageblocks after the first of a held
/// block of several pageblocks too (marked `AllocatedTail`; they answered `NotAllocated`), as a
/// frame, a 2 MiB block and a 2 MiB huge page.
#[test]
fn a_free_of_a_frame_a_scrub_holds_is_a_double_free() {
    use crate::sync::AtomicU8;
    use core::sync::atomic::Ordering;
    use std::sync::Mutex;
    /// Clears nothing; while clearing it lets the test free a frame of the held unit.
    struct Gate {
        clearing: AtomicU8,
        freed: AtomicU8,
    }
    impl FrameClearer for Gate {
        fn clear(&self, _: PhysRange) {
            self.clearing.store(1, Ordering::SeqCst);
            while self.freed.load(Ordering::SeqCst) == 0 {
                std::thread::yield_now();
            }
        }
    }
    let gate = Gate {
        clearing: AtomicU8::new(0),
        freed: AtomicU8::new(0),
    };
    // 16 MiB from 0: one partly covered section, its free pageblocks the fewest aligned
    // blocks, the first of them several pageblocks long; boot memory is dirty.
    let spec = Spec::uniform(1, 4096, 0);
    let mem = SparseMem::default();
    let m = spec.boot(&mem).with_clearer(&gate);
    let zone = m.node(n(0)).unwrap().zone(ZoneKind::Dma32);
    let free_before = zone.counters().free;
    // The second pageblock, inside the first free block.
    let tail = Pfn::new(512);
    assert!(
        zone.buddyinfo()[10..].iter().any(|&c| c > 0),
        "{:?}",
        zone.buddyinfo()
    );
    let results = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        let scrub = s.spawn(|| m.scrub(n(0), 1));
        while gate.clearing.load(Ordering::SeqCst) == 0 {
            assert!(!scrub.is_finished(), "the scrub cleared nothing");
            std::thread::yield_now();
        }
        // While the scrub holds the block; the asserts come after the gate opens.
        let mut r = results.lock().unwrap();
        r.push(m.free(tail, Order::ZERO));
        r.push(m.free(tail, Order::new(9)));
        r.push(m.free_huge(tail, HugeSize::Size2M));
        drop(r);
        gate.freed.store(1, Ordering::SeqCst);
    });
    assert_eq!(zone.counters().free, free_before, "nothing was freed");
    m.check_invariants().unwrap();
    assert_eq!(
        results.into_inner().unwrap(),
        [Err(FreeError::DoubleFree { pfn: tail }); 3],
        "frees of a free frame the scrub holds (order 0, order 9, huge page)"
    );
}

/// The same for a report: `Machine::report` holds the blocks of a batch off the free lists
/// while `f` runs, and a free of a frame of such a block is a double free, in a pageblock after
/// the first of a block too.
#[test]
fn a_free_of_a_frame_a_report_holds_is_a_double_free() {
    let spec = Spec::uniform(1, 4096, 0);
    let mem = SparseMem::default();
    let m = spec.boot(&mem);
    let mut results = Vec::new();
    let mut first = None;
    let reported = m.report(n(0), Order::new(9), 32, |blocks| {
        if first.is_none()
            && let Some(b) = blocks.iter().find(|b| b.frames() >= 1024)
        {
            first = Some(*b);
            let tail = Pfn::new(b.start().get() + 512);
            results.push((tail, m.free(tail, Order::ZERO)));
            results.push((tail, m.free(tail, Order::new(9))));
        }
        true
    });
    assert!(reported.unwrap().blocks > 0);
    assert!(first.is_some(), "a reported block of 4 MiB or more");
    m.check_invariants().unwrap();
    for (tail, r) in results {
        assert_eq!(r, Err(FreeError::DoubleFree { pfn: tail }), "{first:?}");
    }
}

/// Linux 6.12's `calculate_min_free_kbytes()`, transcribed: `lowmem_kbytes` is
/// `nr_free_buffer_pages()` in KiB, the sum over the zones up to `Normal` of their managed
/// pages above their high watermark (the watermarks in force when it runs: none at boot, the
/// old ones on a hot-add's or an offline's `init_per_zone_wmark_min()`).
fn linux_min_free_kbytes(zones: &[(u64, u64)]) -> u64 {
    let lowmem_pages: u64 = zones
        .iter()
        .map(|&(managed, high)| managed.saturating_sub(high))
        .sum();
    let lowmem_kbytes = lowmem_pages * 4;
    (lowmem_kbytes * 16).isqrt().clamp(128, 262_144)
}

/// Linux's `__setup_per_zone_wmarks()` min for one zone, transcribed.
fn linux_min(min_free_kbytes: u64, zone_managed: u64, lowmem_pages: u64) -> u64 {
    let pages_min = min_free_kbytes >> 2;
    pages_min * zone_managed / lowmem_pages
}

/// The watermarks `after` a hot-add or an offline are Linux's: `init_per_zone_wmark_min()`
/// with the high watermarks in force `before`, then `__setup_per_zone_wmarks()` (min, and low
/// and high a gap above it at the default `watermark_scale_factor` of 10).
fn assert_linux_marks(before: &[crate::ZoneCounters], after: &[crate::ZoneCounters], when: &str) {
    let managed: u64 = after.iter().map(|c| c.managed).sum();
    let pairs: Vec<(u64, u64)> = after
        .iter()
        .zip(before)
        .map(|(a, b)| (a.managed, b.marks.high))
        .collect();
    let kb = linux_min_free_kbytes(&pairs);
    for c in after.iter().filter(|c| c.managed > 0) {
        assert_eq!(c.marks.min, linux_min(kb, c.managed, managed), "{when}");
        let gap = (c.marks.min >> 2).max(c.managed * 10 / 10000);
        assert_eq!(
            (c.marks.low, c.marks.high),
            (c.marks.min + gap, c.marks.min + 2 * gap),
            "{when}"
        );
    }
}

/// Boots `spec` with the default options (Linux's `min_free_kbytes` and watermarks).
fn boot_default<'a>(spec: &'a Spec, mem: &'a SparseMem) -> Machine<'a> {
    let topo = Topology::new(&spec.distances, &spec.infos).unwrap();
    Machine::boot(topo, mem, &spec.ranges, BootOptions::default()).unwrap()
}

/// Node 0's zone counters, `Dma32` first.
fn zones(m: &Machine<'_>) -> [crate::ZoneCounters; 2] {
    let node = m.node(n(0)).unwrap();
    ZoneKind::ALL.map(|k| node.zone(k).counters())
}

#[test]
fn hot_add_recomputes_min_free_kbytes_as_linux_does() {
    // One node, 64 MiB, default min_free_kbytes.
    let spec = Spec::uniform(1, 64 * MIB, 0);
    let mem = SparseMem::default();
    let m = boot_default(&spec, &mem);
    // Boot: no watermarks yet, so Linux's lowmem_kbytes is every managed page.
    let before = zones(&m);
    let managed: u64 = before.iter().map(|c| c.managed).sum();
    let kb = linux_min_free_kbytes(&before.map(|c| (c.managed, 0)));
    for c in before {
        assert_eq!(c.marks.min, linux_min(kb, c.managed, managed), "boot");
    }
    // Hot-add 64 MiB more: Linux's online_pages() calls init_per_zone_wmark_min(), whose
    // nr_free_buffer_pages() subtracts the high watermarks in force.
    let added = PhysRange::new(Pfn::new(64 * MIB), Pfn::new(128 * MIB)).unwrap();
    m.hot_add(&mem, n(0), added, FallbackOptions::default())
        .unwrap();
    let after = zones(&m);
    assert_linux_marks(&before, &after, "after hot-add");
}

/// `HINT_BUDGET`: "How many allocations a hint may skip for before a full walk revalidates
/// it: the bound on how long a nearer zone that got memory back can be passed over"; and
/// docs/architecture.md: "It spends a budget of 256 allocations before a full walk
/// revalidates it". A hint that moves forward (the node it pointed at ran out) must not
/// start a fresh budget without a full walk.
#[test]
#[cfg_attr(miri, ignore = "walk logic over many allocations")]
fn a_hint_that_moves_on_does_not_renew_its_budget_without_a_full_walk() {
    let spec = Spec::uniform(4, 2048, 0);
    let mem = SparseMem::default();
    let m = spec.boot(&mem);
    // The first two nodes of node 0's list empty, the third with 50 frames left.
    let (row, mut held) = exhaust_the_first_three(&m);
    let take_out = |held: &mut Vec<Pfn>, node: NodeId, count: u64| {
        let mut out = Vec::new();
        held.retain(|p| {
            let take = m.node_of(*p) == Some(node) && (out.len() as u64) < count;
            if take {
                out.push(*p);
            }
            !take
        });
        m.free_bulk(&out).unwrap();
    };
    take_out(&mut held, row[2], 50);
    // A walk lands on the third node and sets the hint past the empty prefix.
    let p = m.alloc(n(0), Order::ZERO, AllocFlags::empty()).unwrap();
    assert_eq!(m.node_of(p), Some(row[2]));
    held.push(p);
    // Memory returns to the nearest node, well above its low watermark. The hint moves on to
    // the fourth node once the third runs out, but keeps what is left of its budget.
    let low = m
        .node(row[0])
        .unwrap()
        .zone(ZoneKind::Dma32)
        .counters()
        .marks
        .low;
    take_out(&mut held, row[0], low + 16);
    nearest_within_the_budget(&m, row[0], &mut held);
}

/// Linux's `fill_contig_page_info()` and `unusable_free_index()` (mm/vmstat.c), transcribed
/// over a buddyinfo row: the free pages, and the index in thousandths for `suitable_order`.
fn linux_unusable_free_index(
    nr_free: &[u64; crate::addr::NR_ORDERS],
    suitable_order: u32,
) -> (u64, u64) {
    let mut free_pages = 0u64;
    let mut free_blocks_suitable = 0u64;
    for (order, &blocks) in nr_free.iter().enumerate() {
        let order = order as u32;
        free_pages += blocks << order;
        if order >= suitable_order {
            free_blocks_suitable += blocks << (order - suitable_order);
        }
    }
    if free_pages == 0 {
        return (0, 1000);
    }
    let index = (free_pages - (free_blocks_suitable << suitable_order)) * 1000 / free_pages;
    (free_pages, index)
}

/// Every counter a zone and a node report agrees with the memory it counts after a mixed
/// workload (zone, per-CPU and bulk allocations of several orders, frees, huge-page
/// reservation, scrub, report, hot-add and offline): buddyinfo sums to the free count, the
/// unusable index is Linux's `unusable_free_index` of that buddyinfo at every order, node
/// totals are the sums of their zones, every managed page is free, held by the test, in a
/// huge-page pool, cached by a CPU or metadata, and numastat counts each allocated page once.
#[test]
#[cfg_attr(miri, ignore = "a long mixed workload")]
fn every_reported_counter_agrees_with_a_recount_after_a_mixed_workload() {
    struct Zeroes;
    impl FrameClearer for Zeroes {
        fn clear(&self, _: PhysRange) {}
    }
    static CLEAR: Zeroes = Zeroes;
    // Node 0 straddles 4 GiB (both zones), node 1 lies above it.
    let spec = Spec::uniform(2, 16 * 1024, FOUR_GIB - 8 * 1024);
    let mem = SparseMem::default();
    let m = spec
        .boot_with_cpus(&mem, &[n(0), n(1)])
        .with_clearer(&CLEAR);
    let mut held: Vec<(Pfn, Order)> = Vec::new();
    let mut allocated_pages = 0u64;
    let check_with =
        |m: &Machine<'_>, held: &[(Pfn, Order)], allocated_pages: u64, what: &str, away: u64| {
            if away == 0 {
                m.check_invariants().unwrap();
            }
            let mut managed = 0u64;
            let mut accounted = m.cached_pages() + away;
            for node in m.nodes().iter() {
                let (mut free, mut node_managed, mut dirty, mut reported) = (0, 0, 0, 0);
                for k in ZoneKind::ALL {
                    let zone = node.zone(k);
                    let c = zone.counters();
                    let info = zone.buddyinfo();
                    let (linux_free, _) = linux_unusable_free_index(&info, 0);
                    assert_eq!(linux_free, c.free, "{what}: buddyinfo sums to free, {k:?}");
                    for order in 0..=MAX_ORDER {
                        let idx = zone.unusable_index(Order::new(order));
                        let (_, want) = linux_unusable_free_index(&info, u32::from(order));
                        assert_eq!(idx.free_pages, c.free, "{what}: {k:?} order {order}");
                        assert_eq!(idx.thousandths(), want, "{what}: {k:?} order {order}");
                    }
                    assert!(c.dirty <= c.free && c.reported <= c.free, "{what}");
                    let pb = zone.pageblocks();
                    let mut walked = 0u64;
                    zone.for_each_pageblock(|_| walked += 1);
                    assert_eq!(
                        pb.free + pb.whole + pb.split[0] + pb.split[1],
                        walked,
                        "{what}"
                    );
                    assert!(pb.free * 512 <= c.free, "{what}: {k:?} {pb:?}");
                    for size in [HugeSize::Size2M, HugeSize::Size1G] {
                        let pc = zone.pool_counts(size.order());
                        accounted += pc.total << size.order().get();
                    }
                    accounted += c.free + c.metadata;
                    free += c.free;
                    node_managed += c.managed;
                    dirty += c.dirty;
                    reported += c.reported;
                }
                assert_eq!(node.free_pages(), free, "{what}");
                assert_eq!(node.managed_pages(), node_managed, "{what}");
                assert_eq!(node.dirty_pages(), dirty, "{what}");
                assert_eq!(node.reported_pages(), reported, "{what}");
                managed += node_managed;
            }
            accounted += held.iter().map(|&(_, o)| o.frames()).sum::<u64>();
            assert_eq!(
                accounted, managed,
                "{what}: every managed page accounted for once"
            );
            let stats: Vec<NumaStat> = (0..m.nodes().len())
                .map(|i| m.numastat(n(i)).unwrap())
                .collect();
            let hit_miss: u64 = stats.iter().map(|s| s.numa_hit + s.numa_miss).sum();
            let local_other: u64 = stats.iter().map(|s| s.local_node + s.other_node).sum();
            let miss: u64 = stats.iter().map(|s| s.numa_miss).sum();
            let foreign: u64 = stats.iter().map(|s| s.numa_foreign).sum();
            assert_eq!(
                hit_miss, allocated_pages,
                "{what}: numastat counts each allocation once (each page of a bulk)"
            );
            assert_eq!(local_other, allocated_pages, "{what}");
            assert_eq!(miss, foreign, "{what}");
        };
    let check = |m: &Machine<'_>, held: &[(Pfn, Order)], allocated_pages: u64, what: &str| {
        check_with(m, held, allocated_pages, what, 0)
    };
    check(&m, &held, allocated_pages, "boot");
    // Mixed zone allocations of several orders on both nodes.
    for i in 0..400u64 {
        let order = Order::new(if i % 50 == 7 {
            9
        } else {
            [0u8, 0, 1, 3, 0, 2, 0, 0][(i % 8) as usize]
        });
        let node = n((i % 2) as usize);
        let flags = if i % 5 == 0 {
            AllocFlags::SHORT_LIVED
        } else {
            AllocFlags::empty()
        };
        if let Some(p) = m.alloc(node, order, flags) {
            held.push((p, order));
            allocated_pages += 1;
        }
    }
    check(&m, &held, allocated_pages, "zone allocations");
    // Per-CPU allocations.
    for i in 0..700u64 {
        let cpu = m.cpu((i % 2) as usize).unwrap();
        let order = Order::new([0u8, 0, 1, 0, 2][(i % 5) as usize]);
        if let Some(p) = m.alloc_cpu(cpu, order, AllocFlags::empty()) {
            held.push((p, order));
            allocated_pages += 1;
        }
    }
    check(&m, &held, allocated_pages, "per-CPU allocations");
    // Bulk.
    let mut out = [Pfn::new(0); 300];
    let k = m.alloc_bulk(n(1), AllocFlags::empty(), &mut out);
    held.extend(out[..k].iter().map(|&p| (p, Order::ZERO)));
    allocated_pages += k as u64;
    check(&m, &held, allocated_pages, "bulk");
    // Through a claimed CPU's handle: its events arrive when it drops.
    for c in 0..2 {
        let mut h = m.claim_cpu(m.cpu(c).unwrap()).unwrap();
        let mut mine = Vec::new();
        for i in 0..200u64 {
            let order = Order::new([0u8, 0, 1, 0][(i % 4) as usize]);
            if let Some(p) = h.alloc(order, AllocFlags::empty()) {
                mine.push((p, order));
                allocated_pages += 1;
            }
        }
        let mut out = [Pfn::new(0); 64];
        let k = h.alloc_bulk(AllocFlags::empty(), &mut out);
        mine.extend(out[..k].iter().map(|&p| (p, Order::ZERO)));
        allocated_pages += k as u64;
        for (i, (p, o)) in mine.into_iter().enumerate() {
            if i % 3 == 0 {
                h.free(p, o).unwrap();
            } else {
                held.push((p, o));
            }
        }
        drop(h);
        check(&m, &held, allocated_pages, "through a handle");
    }
    // Free every third, some through the CPUs, some clean.
    let mut kept = Vec::new();
    for (i, (p, o)) in held.drain(..).enumerate() {
        match i % 6 {
            0 => m.free(p, o).unwrap(),
            3 => m.free_cpu(m.cpu(i % 2).unwrap(), p, o).unwrap(),
            5 => m.free_clean(p, o).unwrap(),
            _ => kept.push((p, o)),
        }
    }
    held = kept;
    check(&m, &held, allocated_pages, "frees");
    // Huge pages.
    let got = m.reserve_huge(n(0), HugeSize::Size2M, 3) + m.reserve_huge(n(1), HugeSize::Size2M, 4);
    assert!(got > 0);
    check(&m, &held, allocated_pages, "reserve_huge");
    let h = m.alloc_huge(n(1), HugeSize::Size2M).unwrap();
    // numaframe counts a page taken from a pool as an allocation.
    allocated_pages += 1;
    check(&m, &held, allocated_pages, "alloc_huge");
    m.free_huge(h, HugeSize::Size2M).unwrap();
    m.release_huge(n(0), HugeSize::Size2M, 1);
    check(&m, &held, allocated_pages, "release_huge");
    // Scrub, then report.
    for i in 0..2 {
        m.scrub(n(i), 3000);
    }
    check(&m, &held, allocated_pages, "scrub");
    for i in 0..2 {
        let _ = m
            .report(n(i), Order::HUGE_2M, 8, |batch| {
                let away = batch.iter().map(PhysRange::frames).sum();
                check_with(&m, &held, allocated_pages, "during a report", away);
                true
            })
            .unwrap();
    }
    check(&m, &held, allocated_pages, "report");
    // Allocations out of reported memory.
    for i in 0..40u64 {
        let order = Order::new((i % 4) as u8 * 3);
        if let Some(p) = m.alloc(n((i % 2) as usize), order, AllocFlags::ZERO) {
            held.push((p, order));
            allocated_pages += 1;
        }
    }
    check(&m, &held, allocated_pages, "allocations after the report");
    // Hot-add, use, offline.
    let added = PhysRange::new(
        Pfn::new(FOUR_GIB + 128 * MIB),
        Pfn::new(FOUR_GIB + 160 * MIB),
    )
    .unwrap();
    m.hot_add(&mem, n(1), added, FallbackOptions::default())
        .unwrap();
    check(&m, &held, allocated_pages, "hot-add");
    let mut there = Vec::new();
    for _ in 0..50 {
        if let Some(p) = m.alloc(n(1), Order::new(1), AllocFlags::THISNODE) {
            there.push(p);
            allocated_pages += 1;
        }
    }
    for p in there {
        m.free(p, Order::new(1)).unwrap();
    }
    m.drain_all();
    check(&m, &held, allocated_pages, "drain");
    let mut other = Vec::new();
    let busy = loop {
        let p = m.alloc(n(1), Order::ZERO, AllocFlags::THISNODE).unwrap();
        allocated_pages += 1;
        if added.contains(p) {
            break p;
        }
        other.push(p);
    };
    m.free_bulk(&other).unwrap();
    held.push((busy, Order::ZERO));
    {
        let opts = OfflineOptions {
            keep_isolated: true,
            ..OfflineOptions::default()
        };
        assert!(m.offline(&mem, added, opts).is_err());
        check(&m, &held, allocated_pages, "a busy offline kept isolated");
        held.pop();
        m.free(busy, Order::ZERO).unwrap();
        check(&m, &held, allocated_pages, "isolated, freed");
    }
    m.offline(&mem, added, OfflineOptions::default()).unwrap();
    check(&m, &held, allocated_pages, "offline");
    for (p, o) in held.drain(..) {
        m.free(p, o).unwrap();
    }
    m.drain_all();
    check(&m, &held, allocated_pages, "all freed");
}

/// Linux's `offline_pages()` calls `init_per_zone_wmark_min()` after the managed pages went
/// down, with the high watermarks in force before: the watermarks after an offline are Linux's.
#[test]
fn offline_recomputes_min_free_kbytes_as_linux_does() {
    let spec = Spec::uniform(1, 64 * MIB, 0);
    let mem = SparseMem::default();
    let m = boot_default(&spec, &mem);
    let added = PhysRange::new(Pfn::new(FOUR_GIB), Pfn::new(FOUR_GIB + 256 * MIB)).unwrap();
    m.hot_add(&mem, n(0), added, FallbackOptions::default())
        .unwrap();
    let before = zones(&m);
    m.offline(&mem, added, OfflineOptions::default()).unwrap();
    let after = zones(&m);
    assert_linux_marks(&before, &after, "after offline");
    // Normal is gone: Dma32's protection is 0 (Linux: `managed_pages / ratio` of no pages).
    assert_eq!(after[0].marks.protection, 0);
    assert_eq!(before[0].marks.protection, before[1].managed / 256);
}
