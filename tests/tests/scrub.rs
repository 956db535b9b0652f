//! Isolation between owners: zeroed allocations, clean frees and background scrubbing, checked
//! on the bytes of a simulated memory.
//!
//! Every block the test is handed is filled with its owner's tag, so a byte of a previous owner
//! is a nonzero byte; a block handed out with `ZERO` must read as zero all through, on every
//! allocation path. A recording clearer counts what the allocator clears.

use std::sync::Mutex;

use numaframe::policy::{Policy, TaskPolicy};
use numaframe::{
    AllocFlags, BootOptions, CpuId, FrameClearer, HugeSize, Machine, NodeId, NodeMask, Order,
    PAGE_SIZE, Pfn, PhysRange,
};
use numaframe_hosted::sim::{Sim, SimMemory};
use numaframe_hosted::spec::{MachineSpec, NodeSpec};
use proptest::prelude::*;

const MIB: u64 = 1 << 20;

/// Node 0 holds one whole 1 GiB section (and an edge), node 1 only edges.
fn spec() -> MachineSpec {
    let node = |cpu: u32, bytes: u64| NodeSpec {
        cpus: vec![cpu],
        memory_bytes: bytes,
        socket: None,
        initiator: None,
        bandwidth_gbps: None,
    };
    MachineSpec::new(
        "scrub",
        vec![node(0, 1024 * MIB + 64 * MIB), node(1, 64 * MIB)],
        vec![10, 20, 20, 10],
        None,
    )
    .unwrap()
}

/// Clears through the simulated memory and records every range it cleared, and whether it
/// cleared it cold (`FrameClearer::clear_cold`, the streaming stores of `SimMemory`).
struct Recorder<'m> {
    mem: &'m SimMemory,
    cleared: Mutex<Vec<(PhysRange, bool)>>,
}

impl FrameClearer for Recorder<'_> {
    fn clear(&self, range: PhysRange) {
        self.mem.clear(range);
        self.cleared.lock().unwrap().push((range, false));
    }

    fn clear_cold(&self, range: PhysRange) {
        self.mem.clear_cold(range);
        self.cleared.lock().unwrap().push((range, true));
    }
}

impl<'m> Recorder<'m> {
    fn new(mem: &'m SimMemory) -> Self {
        Recorder {
            mem,
            cleared: Mutex::new(Vec::new()),
        }
    }

    /// The frames cleared, hot and cold.
    fn frames(&self) -> u64 {
        self.frames_where(|_| true)
    }

    /// The frames cleared cold.
    fn cold_frames(&self) -> u64 {
        self.frames_where(|cold| cold)
    }

    fn frames_where(&self, keep: impl Fn(bool) -> bool) -> u64 {
        self.cleared
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, cold)| keep(*cold))
            .map(|(r, _)| r.frames())
            .sum()
    }
}

fn boot<'a>(sim: &'a Sim<'_>, rec: &'a Recorder<'a>, zeroed: bool) -> Machine<'a> {
    let cpus = [NodeId::new(0), NodeId::new(1)];
    Machine::boot(
        sim.spec().topology(),
        sim.memory(),
        sim.ranges(),
        BootOptions {
            cpus: &cpus,
            zeroed,
            ..BootOptions::default()
        },
    )
    .unwrap()
    .with_clearer(rec)
}

/// The bytes of `frames` frames from `pfn`.
fn bytes(mem: &SimMemory, pfn: Pfn, frames: u64) -> impl Iterator<Item = &[u8]> {
    (0..frames).map(move |i| {
        let p = mem.frame_ptr(Pfn::new(pfn.get() + i)).unwrap();
        // SAFETY: the frame lies in the simulated memory and belongs to the test (handed out
        // to it and not freed), so nothing else writes it meanwhile.
        unsafe { std::slice::from_raw_parts(p.as_ptr(), PAGE_SIZE as usize) }
    })
}

fn fill(mem: &SimMemory, pfn: Pfn, frames: u64, byte: u8) {
    for i in 0..frames {
        let p = mem.frame_ptr(Pfn::new(pfn.get() + i)).unwrap();
        // SAFETY: as in `bytes`.
        unsafe { p.as_ptr().write_bytes(byte, PAGE_SIZE as usize) };
    }
}

/// The first frame of the block holding a nonzero byte, if any.
fn first_dirty(mem: &SimMemory, pfn: Pfn, frames: u64) -> Option<u64> {
    bytes(mem, pfn, frames)
        .position(|b| b.iter().any(|x| *x != 0))
        .map(|i| i as u64)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Normal,
    Huge,
}

#[derive(Clone, Copy, Debug)]
struct Held {
    pfn: Pfn,
    frames: u64,
    kind: Kind,
}

#[derive(Clone, Debug)]
enum Op {
    /// `path`: 0 node walk, 1 per-CPU, 2 node bulk, 3 weighted-interleave bulk, 4 interleave
    /// single, 5 huge pool.
    Alloc {
        path: u8,
        node: usize,
        order: u8,
        zero: bool,
        n: u8,
    },
    Free {
        i: usize,
        clean: bool,
        cpu: bool,
    },
    Scrub {
        node: usize,
        budget: u16,
    },
    Drain,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..6, 0usize..2, prop_oneof![4 => 0u8..3, 2 => 3u8..9, 1 => 9u8..11], any::<bool>(), 1u8..40)
            .prop_map(|(path, node, order, zero, n)| Op::Alloc { path, node, order, zero, n }),
        5 => (any::<usize>(), any::<bool>(), any::<bool>())
            .prop_map(|(i, clean, cpu)| Op::Free { i, clean, cpu }),
        2 => (0usize..2, 1u16..3000).prop_map(|(node, budget)| Op::Scrub { node, budget }),
        1 => Just(Op::Drain),
    ]
}

/// Runs `ops`; every block handed out with `ZERO` must read as zero.
fn run(ops: &[Op]) -> Result<(), TestCaseError> {
    let spec = spec();
    let sim = Sim::new(&spec).unwrap();
    let rec = Recorder::new(sim.memory());
    let m = boot(&sim, &rec, false);
    let mem = sim.memory();
    // The simulated memory starts out zero: give the memory allocations will come from a
    // previous owner, so that a missed clear shows.
    for node in 0..2 {
        let mut blocks = Vec::new();
        while blocks.len() < 40
            && let Some(p) = m.alloc(NodeId::new(node), Order::new(9), AllocFlags::THISNODE)
        {
            fill(mem, p, 512, 0xee);
            blocks.push(p);
        }
        for p in blocks {
            m.free(p, Order::new(9)).unwrap();
        }
        m.reserve_huge(NodeId::new(node), HugeSize::Size2M, 2);
    }
    let both = NodeMask::from_nodes([NodeId::new(0), NodeId::new(1)]);
    let mut held: Vec<Held> = Vec::new();
    let mut tag = 0u8;
    let mut out = [Pfn::new(0); 64];
    for op in ops {
        match *op {
            Op::Alloc {
                path,
                node,
                order,
                zero,
                n,
            } => {
                let node = NodeId::new(node);
                let flags = if zero {
                    AllocFlags::ZERO
                } else {
                    AllocFlags::empty()
                };
                let cpu = m.cpu(node.index()).unwrap();
                let mut got: Vec<(Pfn, u64, Kind)> = Vec::new();
                match path {
                    0 => got.extend(
                        m.alloc(node, Order::new(order), flags)
                            .map(|p| (p, 1 << order, Kind::Normal)),
                    ),
                    1 => got.extend(
                        m.alloc_cpu(cpu, Order::new(order), flags)
                            .map(|p| (p, 1 << order, Kind::Normal)),
                    ),
                    2 => {
                        let k = m.alloc_bulk(node, flags, &mut out[..usize::from(n)]);
                        got.extend(out[..k].iter().map(|p| (*p, 1, Kind::Normal)));
                    }
                    3 => {
                        let mut p =
                            TaskPolicy::new(&m, Policy::WeightedInterleave(both), false).unwrap();
                        let r = p.alloc_bulk(&m, node, flags, &mut out[..usize::from(n)]);
                        got.extend(out[..r.placed].iter().map(|p| (*p, 1, Kind::Normal)));
                    }
                    4 => {
                        let mut p = TaskPolicy::new(&m, Policy::Interleave(both), false).unwrap();
                        got.extend(
                            p.alloc(&m, node, Order::new(order), flags)
                                .map(|p| (p, 1 << order, Kind::Normal)),
                        );
                    }
                    _ => got.extend(
                        m.alloc_huge_with(node, HugeSize::Size2M, flags)
                            .map(|p| (p, 512, Kind::Huge)),
                    ),
                }
                for (pfn, frames, kind) in got {
                    if zero {
                        prop_assert_eq!(
                            first_dirty(mem, pfn, frames),
                            None,
                            "a zeroed block at {:?} ({} frames, path {}) holds a previous owner's byte",
                            pfn,
                            frames,
                            path
                        );
                    }
                    tag = tag % 255 + 1;
                    fill(mem, pfn, frames, tag);
                    held.push(Held { pfn, frames, kind });
                }
            }
            Op::Free { i, clean, cpu } => {
                if held.is_empty() {
                    continue;
                }
                let h = held.swap_remove(i % held.len());
                if clean {
                    fill(mem, h.pfn, h.frames, 0);
                }
                let order = Order::new(h.frames.trailing_zeros() as u8);
                let c: CpuId = m.cpu(usize::from(cpu)).unwrap();
                let r = match (h.kind, clean, cpu) {
                    (Kind::Huge, _, _) => m.free_huge(h.pfn, HugeSize::Size2M),
                    (_, true, true) => m.free_cpu_clean(c, h.pfn, order),
                    (_, true, false) => m.free_clean(h.pfn, order),
                    (_, false, true) => m.free_cpu(c, h.pfn, order),
                    (_, false, false) => m.free(h.pfn, order),
                };
                prop_assert!(r.is_ok(), "{:?}", r);
            }
            Op::Scrub { node, budget } => {
                let left = m.scrub(NodeId::new(node), u64::from(budget));
                prop_assert_eq!(left, m.node(NodeId::new(node)).unwrap().dirty_pages());
            }
            Op::Drain => m.drain_all(),
        }
        m.check_invariants()
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
    }
    // Whatever was cleared lay in the machine's memory.
    let total = spec.total_memory_bytes() / PAGE_SIZE;
    prop_assert!(
        rec.cleared
            .lock()
            .unwrap()
            .iter()
            .all(|(r, _)| r.end().get() <= total)
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn zeroed_blocks_never_hold_a_previous_owners_byte(ops in prop::collection::vec(op(), 1..60)) {
        run(&ops)?;
    }
}

#[test]
fn boot_memory_is_dirty_and_scrub_cleans_all_of_it() {
    let spec = spec();
    let sim = Sim::new(&spec).unwrap();
    let rec = Recorder::new(sim.memory());
    let m = boot(&sim, &rec, false);
    for node in m.nodes() {
        assert_eq!(
            node.dirty_pages(),
            node.free_pages(),
            "boot memory starts dirty"
        );
    }
    let dirty: u64 = m.nodes().iter().map(|n| n.dirty_pages()).sum();
    for node in [NodeId::new(0), NodeId::new(1)] {
        let mut calls = 0;
        let mut left = m.node(node).unwrap().dirty_pages();
        while left > 0 {
            let before = left;
            left = m.scrub(node, 4096);
            assert!(left < before, "a scrub with work to do makes progress");
            m.check_invariants().unwrap();
            calls += 1;
        }
        assert!(calls > 1, "the budget bounds each call");
    }
    // Every dirty frame was cleared once, and nothing else, cold: nobody is about to use it.
    assert_eq!(rec.frames(), dirty);
    assert_eq!(rec.cold_frames(), dirty);
    // All clean now: a zeroed allocation clears nothing.
    let p = m
        .alloc(NodeId::new(0), Order::new(9), AllocFlags::ZERO)
        .unwrap();
    let q = m
        .alloc(NodeId::new(1), Order::ZERO, AllocFlags::ZERO)
        .unwrap();
    assert_eq!(rec.frames(), dirty);
    m.free(p, Order::new(9)).unwrap();
    m.free(q, Order::ZERO).unwrap();
    assert_eq!(m.node(NodeId::new(0)).unwrap().dirty_pages(), 512);
    m.check_invariants().unwrap();
}

#[test]
fn zeroed_allocations_clear_hot_and_the_scrub_clears_cold() {
    let spec = spec();
    let sim = Sim::new(&spec).unwrap();
    let rec = Recorder::new(sim.memory());
    let m = boot(&sim, &rec, false);
    let n0 = NodeId::new(0);
    // Boot memory is dirty: a zeroed allocation clears its block where its owner uses it next.
    let p = m.alloc(n0, Order::new(9), AllocFlags::ZERO).unwrap();
    let q = m.alloc(n0, Order::ZERO, AllocFlags::ZERO).unwrap();
    assert_eq!((rec.frames(), rec.cold_frames()), (513, 0));
    m.free(p, Order::new(9)).unwrap();
    m.free(q, Order::ZERO).unwrap();
    // The scrub clears what nobody is about to use, cold.
    let dirty = m.node(n0).unwrap().dirty_pages();
    while m.scrub(n0, 1 << 16) > 0 {}
    assert_eq!(rec.cold_frames(), dirty);
    assert_eq!(rec.frames(), 513 + dirty);
    m.check_invariants().unwrap();
}

/// `SimMemory`'s cold clearing (streaming stores) zeroes every byte of its range and nothing
/// around it, for ranges of a frame, of a pageblock and of neither, in an arena at a page
/// boundary and in one whose base is not 16-byte aligned (`SimMemory` takes any base; streaming
/// stores would fault there).
#[test]
fn cold_clearing_zeroes_exactly_its_range_in_an_arena_at_any_base() {
    let range = |a: u64, b: u64| PhysRange::new(Pfn::new(a), Pfn::new(b)).unwrap();
    for base in [0, 8] {
        let mem = SimMemory::new(&[(base, 8 * MIB)]).unwrap();
        // The whole frames of the arena.
        let (lo, hi) = (base.div_ceil(PAGE_SIZE), (base + 8 * MIB) / PAGE_SIZE);
        for (a, b) in [(lo, lo + 1), (lo + 1, 514), (512, 1024), (1500, hi)] {
            // SAFETY: the test owns the whole memory; no machine uses it.
            unsafe { mem.fill(range(lo, hi), 0xa5) };
            mem.clear_cold(range(a, b));
            assert_eq!(mem.first_other(range(a, b), 0), None, "{a}..{b} reads zero");
            if a > lo {
                assert_eq!(mem.first_other(range(lo, a), 0xa5), None, "below {a}..{b}");
            }
            if b < hi {
                assert_eq!(mem.first_other(range(b, hi), 0xa5), None, "above {a}..{b}");
            }
        }
    }
}

/// `SimMemory` takes arenas at any physical base, and keeps `PhysMemory`'s promise in every one:
/// a range it maps comes with a pointer aligned to `PAGE_SIZE` (platform.rs, "Safety", 1), or
/// not at all. An arena whose base is not page aligned cannot give whole frames such a pointer.
#[test]
fn sim_memory_maps_ranges_page_aligned_or_not_at_all_in_an_arena_at_any_base() {
    use numaframe::PhysMemory;
    let range = |a: u64, b: u64| PhysRange::new(Pfn::new(a), Pfn::new(b)).unwrap();
    for base in [0, 8, PAGE_SIZE, PAGE_SIZE + 2048] {
        let mem = SimMemory::new(&[(base, 8 * MIB)]).unwrap();
        let (lo, hi) = (base.div_ceil(PAGE_SIZE), (base + 8 * MIB) / PAGE_SIZE);
        for r in [range(lo, lo + 1), range(lo + 1, 514), range(1500, hi)] {
            if let Some(p) = mem.map(r) {
                assert!(
                    (p.as_ptr() as usize).is_multiple_of(PAGE_SIZE as usize),
                    "arena at {base:#x}: {r:?} mapped at {p:p}"
                );
                mem.unmap(r, p);
            }
        }
    }
}

#[test]
fn zeroed_boot_memory_is_clean_and_only_dirty_frames_are_cleared() {
    let spec = spec();
    let sim = Sim::new(&spec).unwrap();
    let rec = Recorder::new(sim.memory());
    let m = boot(&sim, &rec, true);
    let n0 = NodeId::new(0);
    assert_eq!(m.node(n0).unwrap().dirty_pages(), 0);
    // An order-1 block gives its pageblock an extra plane: its free frames' dirt is told
    // apart frame by frame.
    let x = m.alloc(n0, Order::new(1), AllocFlags::THISNODE).unwrap();
    // Without ZERO nothing is cleared, and the owner's bytes stay where it left them.
    let a = m.alloc(n0, Order::ZERO, AllocFlags::THISNODE).unwrap();
    fill(sim.memory(), a, 1, 0xa5);
    m.free(a, Order::ZERO).unwrap();
    assert_eq!(m.node(n0).unwrap().dirty_pages(), 1);
    let b = m.alloc(n0, Order::ZERO, AllocFlags::THISNODE).unwrap();
    assert_eq!(rec.frames(), 0, "nothing is cleared without the flag");
    if b == a {
        assert_eq!(first_dirty(sim.memory(), b, 1), Some(0));
    }
    m.free(b, Order::ZERO).unwrap();
    // A zeroed allocation takes a clean frame of the pageblock rather than clear the dirty one.
    let c = m.alloc(n0, Order::ZERO, AllocFlags::ZERO).unwrap();
    assert_ne!(c, b);
    assert_eq!(rec.frames(), 0);
    m.free_clean(c, Order::ZERO).unwrap();
    m.free_clean(x, Order::new(1)).unwrap();
    assert_eq!(m.node(n0).unwrap().dirty_pages(), 1);
    m.check_invariants().unwrap();
}

#[test]
fn zero_without_a_clearer_fails_and_changes_nothing() {
    let spec = spec();
    let sim = Sim::new(&spec).unwrap();
    let m = Machine::boot(
        spec.topology(),
        sim.memory(),
        sim.ranges(),
        BootOptions::default(),
    )
    .unwrap();
    let n0 = NodeId::new(0);
    let free = m.node(n0).unwrap().free_pages();
    assert_eq!(m.alloc(n0, Order::ZERO, AllocFlags::ZERO), None);
    let mut out = [Pfn::new(0); 4];
    assert_eq!(m.alloc_bulk(n0, AllocFlags::ZERO, &mut out), 0);
    assert_eq!(m.node(n0).unwrap().free_pages(), free);
    assert_eq!(m.scrub(n0, 1000), m.node(n0).unwrap().dirty_pages());
    assert_eq!(m.node(n0).unwrap().dirty_pages(), free);
}

/// A scrub running on one thread while another takes every free frame with `ZERO`: the
/// allocations never fail while memory is free (a unit the scrub holds comes back when they
/// wait for it), and every frame reads as zero.
#[test]
fn allocations_take_back_what_a_running_scrub_holds() {
    let spec = spec();
    let sim = Sim::new(&spec).unwrap();
    let rec = Recorder::new(sim.memory());
    let m = boot(&sim, &rec, false);
    let n1 = NodeId::new(1);
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                m.scrub(n1, 1 << 14);
            }
        });
        let mut got = Vec::new();
        let free = m
            .node(n1)
            .unwrap()
            .zone(numaframe::ZoneKind::Dma32)
            .counters();
        let want = free.free - free.marks.min;
        for _ in 0..want {
            let Some(p) = m.alloc(n1, Order::ZERO, AllocFlags::ZERO | AllocFlags::THISNODE) else {
                break;
            };
            assert_eq!(first_dirty(sim.memory(), p, 1), None);
            fill(sim.memory(), p, 1, 7);
            got.push(p);
            if got.len() % 512 == 0 {
                // The walk sees a held unit as free, counted and marked consistently.
                m.check_invariants().unwrap();
                // Frees race the scrub too: half of them come back dirty into the zone.
                let p = got.swap_remove(got.len() / 2);
                m.free(p, Order::ZERO).unwrap();
                let q = m
                    .alloc(n1, Order::ZERO, AllocFlags::ZERO | AllocFlags::THISNODE)
                    .unwrap();
                assert_eq!(first_dirty(sim.memory(), q, 1), None);
                fill(sim.memory(), q, 1, 7);
                got.push(q);
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(
            got.len() as u64,
            want,
            "every free frame above min was handed out"
        );
        for p in got {
            m.free(p, Order::ZERO).unwrap();
        }
    });
    m.check_invariants().unwrap();
}

/// A refused `free_bulk` must leave the state as it was ("A failed call leaves the state as it
/// was", docs/promises.md), the dirty count included (`keep_clean_apart`'s comment: "and
/// `FreeArea::bulk_undo` restores the dirty count exactly"). When the metadata pool cannot
/// spare an extra plane, the bulk's dirty free turns the pageblock's flag dirty, and the undo
/// leaves the flag set: the pageblock's clean free frames now count dirty.
#[test]
fn a_refused_bulk_free_leaves_the_dirty_count_as_it_was() {
    use numaframe_testkit::{SparseMem, Spec};
    use std::collections::BTreeMap;
    const PB: u64 = 512;
    let spec = Spec::uniform(1, 2 << 18, 1 << 20);
    let mem = SparseMem::default();
    let m = spec.boot_with(
        &mem,
        BootOptions {
            zeroed: true,
            ..spec.options()
        },
    );
    let n0 = NodeId::new(0);
    let dirty = || m.node(n0).unwrap().dirty_pages();
    let mut by_pb: BTreeMap<u64, Vec<Pfn>> = BTreeMap::new();
    for _ in 0..600 * PB {
        let p = m.alloc(n0, Order::ZERO, AllocFlags::empty()).unwrap();
        by_pb.entry(p.get() / PB).or_default().push(p);
    }
    let mut full: Vec<Vec<Pfn>> = by_pb
        .into_values()
        .filter(|v| v.len() as u64 == PB)
        .collect();
    assert!(full.len() > 100);
    let last = full.pop().unwrap();
    // Dirty frees into clean pageblocks take extra planes until the pool has none to spare
    // (frees never grow it): then a clean free next to a dirty one counts dirty.
    let mut exhausted = false;
    for pb in &full {
        m.free(pb[0], Order::ZERO).unwrap();
        let before = dirty();
        m.free_clean(pb[1], Order::ZERO).unwrap();
        if dirty() > before {
            exhausted = true;
            break;
        }
    }
    assert!(exhausted, "the pool ran out of extra planes");
    m.check_invariants().unwrap();
    // A clean pageblock without an extra plane, with one clean free frame.
    m.free_clean(last[0], Order::ZERO).unwrap();
    let before = dirty();
    let free_before = m.node(n0).unwrap().free_pages();
    // `last[0]` is free already: the bulk is refused at index 1.
    let err = m.free_bulk(&[last[1], last[0]]).unwrap_err();
    assert_eq!(err.index, 1);
    assert_eq!(m.node(n0).unwrap().free_pages(), free_before);
    m.check_invariants().unwrap();
    assert_eq!(
        dirty(),
        before,
        "a refused bulk free changed the dirty count"
    );
}
