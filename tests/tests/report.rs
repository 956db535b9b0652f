//! Free-page reporting through the public API: what a report hands over, what it marks, and
//! what allocation, frees and merges do to the marks.
//!
//! The oracle is the rule written out here: a report hands over free blocks of at least the
//! order asked, each once until some part of it is freed again; the frames it handed over that
//! no allocation touched since are what the counters call reported.

use std::collections::BTreeSet;
use std::sync::Mutex;

use numaframe::{
    AllocFlags, BootOptions, FrameClearer, InstallHook, Machine, NodeId, Order, Pfn, PhysRange,
    REPORT_CAPACITY, ReportError, ZoneKind,
};
use numaframe_testkit::{Rng, Snap, SparseMem, Spec};
use proptest::prelude::*;

const PB: u64 = 512;
const SECTION: u64 = 1 << 18;

/// One node above 4 GiB: two whole sections, then 300 pageblocks and 77 frames of a third.
fn spec() -> Spec {
    Spec::uniform(1, 2 * SECTION + 300 * PB + 77, 1 << 20)
}

fn node0() -> NodeId {
    NodeId::new(0)
}

/// Boots `spec` on `mem` with its memory dirty (not declared zeroed).
fn boot_dirty<'m>(spec: &'m Spec, mem: &'m SparseMem) -> Machine<'m> {
    spec.boot_with(
        mem,
        BootOptions {
            zeroed: false,
            ..spec.options()
        },
    )
}

/// Reports node 0 at `order` with `capacity`, returning every batch.
fn report(m: &Machine<'_>, order: u8, capacity: usize) -> Vec<Vec<PhysRange>> {
    let mut batches = Vec::new();
    let done = m
        .report(node0(), Order::new(order), capacity, |b| {
            batches.push(b.to_vec());
            true
        })
        .unwrap();
    let blocks: Vec<_> = batches.iter().flatten().collect();
    assert_eq!(done.blocks, blocks.len() as u64);
    assert_eq!(done.frames, blocks.iter().map(|r| r.frames()).sum::<u64>());
    assert_eq!(done.batches, batches.len() as u64);
    assert!(!done.refused);
    batches
}

fn flat(batches: &[Vec<PhysRange>]) -> Vec<PhysRange> {
    batches.iter().flatten().copied().collect()
}

fn reported(m: &Machine<'_>) -> u64 {
    m.node(node0()).unwrap().reported_pages()
}

/// Free frames in free blocks of at least `order`, from buddyinfo.
fn free_in_blocks(m: &Machine<'_>, order: u8) -> u64 {
    ZoneKind::ALL
        .iter()
        .map(|&k| {
            let info = m.node(node0()).unwrap().zone(k).buddyinfo();
            (usize::from(order)..info.len())
                .map(|i| info[i] << i)
                .sum::<u64>()
        })
        .sum()
}

/// The blocks are whole, aligned blocks of at least `order`, and no two overlap.
fn assert_blocks(blocks: &[PhysRange], order: u8) {
    let mut seen = BTreeSet::new();
    for r in blocks {
        let f = r.frames();
        assert!(
            f.is_power_of_two() && f >= 1 << order,
            "{r:?} is a block of order >= {order}"
        );
        assert_eq!(r.start().get() % f, 0, "{r:?} is aligned");
        assert!(seen.insert(r.start().get()), "{r:?} once");
    }
    let mut sorted: Vec<_> = blocks.to_vec();
    sorted.sort_by_key(|r| r.start());
    for w in sorted.windows(2) {
        assert!(
            w[0].end() <= w[1].start(),
            "{:?} and {:?} overlap",
            w[0],
            w[1]
        );
    }
}

#[test]
fn a_report_hands_over_every_free_block_once_and_marks_it() {
    let spec = spec();
    let mem = SparseMem::default();
    let m = spec.boot(&mem);
    let want = free_in_blocks(&m, 9);
    let batches = report(&m, 9, 7);
    assert!(batches.iter().all(|b| !b.is_empty() && b.len() <= 7));
    let blocks = flat(&batches);
    assert_blocks(&blocks, 9);
    let frames: u64 = blocks.iter().map(|r| r.frames()).sum();
    assert_eq!(frames, want, "every frame in free blocks of 2 MiB or more");
    assert!(
        blocks.iter().any(|r| r.frames() == SECTION),
        "whole sections as 1 GiB blocks"
    );
    assert_eq!(reported(&m), frames);
    assert_eq!(
        m.node(node0())
            .unwrap()
            .zone(ZoneKind::Normal)
            .counters()
            .reported,
        frames
    );
    m.check_invariants().unwrap();
    assert!(
        flat(&report(&m, 9, 32)).is_empty(),
        "nothing twice without a free"
    );
    m.check_invariants().unwrap();
}

#[test]
fn the_order_is_a_lower_bound() {
    let spec = spec();
    let mem = SparseMem::default();
    let m = spec.boot(&mem);
    let big = free_in_blocks(&m, 14);
    let all = free_in_blocks(&m, 9);
    let blocks = flat(&report(&m, 14, 32));
    assert_blocks(&blocks, 14);
    assert_eq!(blocks.iter().map(|r| r.frames()).sum::<u64>(), big);
    let rest = flat(&report(&m, 9, 32));
    assert_blocks(&rest, 9);
    assert!(rest.iter().all(|r| r.frames() < 1 << 14));
    assert_eq!(rest.iter().map(|r| r.frames()).sum::<u64>(), all - big);
    assert_eq!(reported(&m), all);
    m.check_invariants().unwrap();
}

#[test]
fn allocation_clears_the_mark_and_a_free_next_to_reported_memory_unreports_the_merge() {
    let spec = spec();
    let mem = SparseMem::default();
    let m = spec.boot(&mem);
    let first = flat(&report(&m, 9, 32));
    let total = reported(&m);
    let p = m
        .alloc(node0(), Order::new(9), AllocFlags::empty())
        .unwrap();
    let home = *first
        .iter()
        .find(|r| r.contains(p))
        .expect("the block came from reported memory");
    assert_eq!(
        reported(&m),
        total - PB,
        "the allocated block lost its mark, the rest kept it"
    );
    m.check_invariants().unwrap();
    assert!(
        flat(&report(&m, 9, 32)).is_empty(),
        "the parts left free are still reported"
    );
    m.free(p, Order::new(9)).unwrap();
    m.check_invariants().unwrap();
    assert_eq!(
        reported(&m),
        total - home.frames(),
        "merged with reported buddies, the block is unreported as a whole"
    );
    assert_eq!(
        flat(&report(&m, 9, 32)),
        vec![home],
        "reported again as a whole, nothing else"
    );
    assert_eq!(reported(&m), total);
    m.check_invariants().unwrap();
}

/// Records every range the hook sees.
struct Installs(Mutex<Vec<PhysRange>>);

impl InstallHook for Installs {
    fn install(&self, range: PhysRange) {
        self.0.lock().unwrap().push(range);
    }
}

#[test]
fn reuse_of_reported_memory_goes_through_the_install_hook() {
    static HOOK: Installs = Installs(Mutex::new(Vec::new()));
    let spec = spec();
    let mem = SparseMem::default();
    let m = spec.boot(&mem).with_install(&HOOK);
    let p = m
        .alloc(node0(), Order::new(9), AllocFlags::empty())
        .unwrap();
    m.free(p, Order::new(9)).unwrap();
    assert!(
        HOOK.0.lock().unwrap().is_empty(),
        "unreported memory is not installed"
    );
    let _ = report(&m, 9, 32);
    let total = reported(&m);
    let q = m
        .alloc(node0(), Order::new(10), AllocFlags::empty())
        .unwrap();
    // The first short-lived frame needs a pageblock of its own (the long-lived class has the
    // split one the boot tables left).
    let small = m
        .alloc(node0(), Order::ZERO, AllocFlags::SHORT_LIVED)
        .unwrap();
    let installs = HOOK.0.lock().unwrap().clone();
    let pb_of = |f: Pfn| {
        PhysRange::new(
            Pfn::new(f.get() & !(PB - 1)),
            Pfn::new((f.get() & !(PB - 1)) + PB),
        )
        .unwrap()
    };
    assert_eq!(
        installs[0],
        PhysRange::new(q, Pfn::new(q.get() + 1024)).unwrap()
    );
    assert!(
        installs[1..].contains(&pb_of(small)),
        "the pageblock split for a frame"
    );
    let installed: u64 = installs.iter().map(|r| r.frames()).sum();
    assert_eq!(
        reported(&m),
        total - installed,
        "installed memory is no longer reported"
    );
    m.check_invariants().unwrap();
}

/// Counts the frames it is asked to clear.
struct Counting(Mutex<u64>);

impl FrameClearer for Counting {
    fn clear(&self, range: PhysRange) {
        *self.0.lock().unwrap() += range.frames();
    }
}

/// A reported block counts clean only on a machine whose host gives reported memory back
/// zeroed (`Machine::with_zeroing_host`): a zeroed allocation from it then clears nothing.
/// Elsewhere (virtio-balloon's reporting may keep a page's contents) it keeps its dirty state,
/// and the allocation clears every frame of it.
#[test]
fn reported_memory_is_clean_only_if_the_host_zeroes_it() {
    for zeroing in [true, false] {
        let spec = spec();
        let mem = SparseMem::default();
        let clearer = Counting(Mutex::new(0));
        let m = boot_dirty(&spec, &mem).with_clearer(&clearer);
        let m = if zeroing { m.with_zeroing_host() } else { m };
        let node = m.node(node0()).unwrap();
        assert_eq!(
            node.dirty_pages(),
            node.free_pages(),
            "boot memory is dirty"
        );
        let frames: u64 = flat(&report(&m, 9, 32)).iter().map(|r| r.frames()).sum();
        assert_eq!(node.reported_pages(), frames);
        let dirty = if zeroing {
            node.free_pages() - frames
        } else {
            node.free_pages()
        };
        assert_eq!(node.dirty_pages(), dirty, "zeroing host: {zeroing}");
        m.check_invariants().unwrap();
        let p = m.alloc(node0(), Order::new(9), AllocFlags::ZERO).unwrap();
        assert_eq!(
            *clearer.0.lock().unwrap(),
            if zeroing { 0 } else { 512 },
            "zeroing host: {zeroing}"
        );
        m.free(p, Order::new(9)).unwrap();
        m.check_invariants().unwrap();
    }
}

#[test]
fn a_refused_batch_comes_back_as_it_was() {
    let spec = spec();
    let mem = SparseMem::default();
    let m = spec.boot(&mem);
    let node = m.node(node0()).unwrap();
    let (snap, dirty) = (Snap::of(&m), node.dirty_pages());
    let mut calls = 0;
    let done = m
        .report(node0(), Order::new(9), 4, |b| {
            calls += 1;
            assert!(b.len() <= 4);
            false
        })
        .unwrap();
    assert_eq!(calls, 1, "the report stops at the refusal");
    assert!(done.refused);
    assert_eq!((done.blocks, done.frames), (0, 0));
    assert_eq!(Snap::of(&m), snap);
    assert_eq!((node.dirty_pages(), node.reported_pages()), (dirty, 0));
    m.check_invariants().unwrap();
}

#[test]
fn bad_calls_are_typed_errors_and_change_nothing() {
    let spec = spec();
    let mem = SparseMem::default();
    let m = spec.boot(&mem);
    let snap = Snap::of(&m);
    let never = |_: &[PhysRange]| -> bool { panic!("no batch on a bad call") };
    for order in [0u8, 1, 8] {
        assert_eq!(
            m.report(node0(), Order::new(order), 4, never),
            Err(ReportError::BadOrder {
                order: Order::new(order)
            })
        );
    }
    for capacity in [0, REPORT_CAPACITY + 1, usize::MAX] {
        assert_eq!(
            m.report(node0(), Order::new(9), capacity, never),
            Err(ReportError::BadCapacity { capacity })
        );
    }
    assert_eq!(
        m.report(NodeId::new(3), Order::new(9), 4, never),
        Err(ReportError::UnknownNode {
            node: NodeId::new(3)
        })
    );
    assert_eq!(Snap::of(&m), snap);
    assert_eq!(reported(&m), 0);
    m.check_invariants().unwrap();
}

/// What the test holds: blocks it allocated.
#[derive(Clone, Debug)]
enum Op {
    Alloc(u8),
    Free(usize),
    Report(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..12).prop_map(Op::Alloc),
        3 => any::<usize>().prop_map(Op::Free),
        1 => (9u8..=18).prop_map(Op::Report),
    ]
}

/// Random allocations, frees and reports against the rule: a reported block is wholly free,
/// holds some pageblock never reported, or freed or merged with freed memory since it was last
/// reported, and the frames the counters call reported are among those reported and untouched
/// by an allocation or a merge since.
fn run(ops: &[Op]) -> Result<(), TestCaseError> {
    let spec = spec();
    let mem = SparseMem::default();
    let m = spec.boot(&mem);
    let mut held: Vec<(Pfn, u8)> = Vec::new();
    // Pageblocks reported and not touched since: no frame allocated, no free next to them.
    let mut marked: BTreeSet<u64> = BTreeSet::new();
    // Pageblocks reported and no frame allocated since: what the counters may call reported.
    let mut kept: BTreeSet<u64> = BTreeSet::new();
    let mut busy: BTreeSet<u64> = BTreeSet::new();
    let pbs = |p: Pfn, order: u8| {
        let first = p.get() / PB;
        first..=(p.get() + (1u64 << order) - 1) / PB
    };
    for op in ops {
        match *op {
            Op::Alloc(order) => {
                if let Some(p) = m.alloc(node0(), Order::new(order), AllocFlags::empty()) {
                    for pb in pbs(p, order) {
                        marked.remove(&pb);
                        kept.remove(&pb);
                    }
                    for f in p.get()..p.get() + (1 << order) {
                        busy.insert(f);
                    }
                    held.push((p, order));
                }
            }
            Op::Free(i) if !held.is_empty() => {
                let (p, order) = held.swap_remove(i % held.len());
                m.free(p, Order::new(order)).unwrap();
                for f in p.get()..p.get() + (1 << order) {
                    busy.remove(&f);
                }
                // The freed block may merge with any free memory of the aligned blocks around
                // it, and a merge with reported memory unreports it (now or when a wholly free
                // pageblock kept split is merged later).
                let mut around = (p, order);
                for k in order.max(9)..=18 {
                    let base = p.get() & !((1u64 << k) - 1);
                    if busy.range(base..base + (1 << k)).next().is_some() {
                        break;
                    }
                    around = (Pfn::new(base), k);
                }
                for pb in pbs(around.0, around.1) {
                    marked.remove(&pb);
                }
            }
            Op::Free(_) => {}
            Op::Report(order) => {
                for r in flat(&report(&m, order, 3)) {
                    prop_assert!(r.frames() >= 1 << order && r.frames().is_power_of_two());
                    prop_assert!(busy.range(r.start().get()..r.end().get()).next().is_none());
                    let pbs: Vec<u64> = pbs(r.start(), r.frames().trailing_zeros() as u8).collect();
                    prop_assert!(
                        pbs.iter().any(|pb| !marked.contains(pb)),
                        "{:?} reported twice with no free in between",
                        r
                    );
                    marked.extend(pbs.iter().copied());
                    kept.extend(pbs);
                }
            }
        }
        m.check_invariants()
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!(reported(&m) <= kept.len() as u64 * PB);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
    #[test]
    fn reports_follow_the_rule(ops in prop::collection::vec(op(), 1..80)) {
        run(&ops)?;
    }
}

#[test]
fn a_long_random_run_follows_the_rule() {
    let mut rng = Rng::new(17);
    let ops: Vec<Op> = (0..3000)
        .map(|_| match rng.below(8) {
            0..4 => Op::Alloc(rng.below(12) as u8),
            4..7 => Op::Free(rng.below(1 << 20) as usize),
            _ => Op::Report(9 + rng.below(10) as u8),
        })
        .collect();
    run(&ops).unwrap();
}

/// Stops in its first clear until the test has looked at the machine.
struct Gate {
    armed: std::sync::atomic::AtomicBool,
    inside: std::sync::Barrier,
    looked: std::sync::Barrier,
}

impl FrameClearer for Gate {
    fn clear(&self, _range: PhysRange) {
        if self.armed.swap(false, std::sync::atomic::Ordering::SeqCst) {
            self.inside.wait();
            self.looked.wait();
        }
    }
}

/// A scrub of reported memory on a host that does not zero it (the reported block keeps its
/// dirty state, so the scrub takes it): the invariant walk run while the scrub holds the block
/// must pass, as it does for a scrub of unreported memory.
#[test]
fn the_invariant_walk_passes_while_a_scrub_holds_reported_memory() {
    for whole in [false, true] {
        let spec = spec();
        let mem = SparseMem::default();
        let gate = Gate {
            armed: std::sync::atomic::AtomicBool::new(true),
            inside: std::sync::Barrier::new(2),
            looked: std::sync::Barrier::new(2),
        };
        let m = boot_dirty(&spec, &mem).with_clearer(&gate);
        // Both whole sections handed out: the scrub then takes a block of pageblocks of the
        // third section; `whole` leaves them free, so it takes a whole section.
        let held: Vec<Pfn> = if whole {
            Vec::new()
        } else {
            (0..2)
                .map(|_| {
                    m.alloc(node0(), Order::new(18), AllocFlags::empty())
                        .unwrap()
                })
                .collect()
        };
        let frames: u64 = flat(&report(&m, 9, 32)).iter().map(|r| r.frames()).sum();
        assert!(frames > 0);
        m.check_invariants().unwrap();
        let during = std::thread::scope(|s| {
            let scrub = s.spawn(|| m.scrub(node0(), 512));
            gate.inside.wait();
            let during = m.check_invariants();
            gate.looked.wait();
            scrub.join().unwrap();
            during
        });
        m.check_invariants().unwrap();
        assert_eq!(
            during,
            Ok(()),
            "invariant walk while a scrub holds reported memory (whole section: {whole})"
        );
        for p in held {
            m.free(p, Order::new(18)).unwrap();
        }
    }
}

/// Records the ranges it clears, and the installs seen before each.
struct ClearLog<'h> {
    hook: &'h Installs,
    cleared: Mutex<Vec<(PhysRange, usize)>>,
}

impl FrameClearer for ClearLog<'_> {
    fn clear(&self, range: PhysRange) {
        let installs = self.hook.0.lock().unwrap().len();
        self.cleared.lock().unwrap().push((range, installs));
    }
}

/// The install hook "makes `range`, which the host had taken back, usable memory again", and
/// runs "before memory taken back through `Machine::report` is used again": a background scrub
/// that writes zeros into reported memory (a host that does not zero it leaves it dirty, so
/// the scrub takes it) must install it first, as an allocation does.
#[test]
fn a_scrub_does_not_write_reported_memory_the_host_took_back() {
    static HOOK: Installs = Installs(Mutex::new(Vec::new()));
    let spec = spec();
    let mem = SparseMem::default();
    let log = ClearLog {
        hook: &HOOK,
        cleared: Mutex::new(Vec::new()),
    };
    let m = boot_dirty(&spec, &mem)
        .with_clearer(&log)
        .with_install(&HOOK);
    let blocks = flat(&report(&m, 9, 32));
    assert!(!blocks.is_empty());
    let _ = m.scrub(node0(), 1 << 20);
    let installs = HOOK.0.lock().unwrap().clone();
    let cleared = log.cleared.lock().unwrap().clone();
    assert!(!cleared.is_empty(), "the scrub cleared something");
    for (range, seen) in cleared {
        let Some(block) = blocks.iter().find(|b| b.contains(range.start())) else {
            continue;
        };
        assert!(
            installs[..seen].iter().any(|i| i.contains(range.start())),
            "the scrub cleared {range:?} of reported block {block:?} the host took back, \
             never installed (installs: {installs:?})"
        );
    }
    m.check_invariants().unwrap();
}
