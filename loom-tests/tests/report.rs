//! Free-page reporting racing the paths that touch the blocks it holds: an allocation that
//! wants the block being reported, and a free of its buddy. The report hands its batch to the
//! host with no lock held, so the allocation may run while the block is off the free lists:
//! it must not get the block then, and afterwards the block is reported exactly when nobody
//! allocated it, and the counters agree with the marks.
//!
//! The machine is one node of four pageblocks (2048 frames); the boot's tables take part of the
//! last, so the model holds the other blocks and leaves the pageblocks it names free.
#![cfg(numaframe_loom)]

use std::sync::atomic::{AtomicU64, Ordering};

use loom::sync::Arc;
use numaframe::{
    AllocFlags, InstallHook, Machine, NodeId, Order, Pfn, PhysRange, Reported, ZoneKind,
};
use numaframe_loom::{SparseMem, Steps, Tiny, keep, model_up_to, spawn};

const PB: u64 = 512;

fn node0() -> NodeId {
    NodeId::new(0)
}

fn reported(m: &Machine<'_>) -> u64 {
    m.node(node0()).expect("node 0").reported_pages()
}

/// Frames the install hook saw in the running execution (loom runs executions one after the
/// other on one test thread, and each model resets it first).
static INSTALLED: AtomicU64 = AtomicU64::new(0);

struct Counting;

impl InstallHook for Counting {
    fn install(&self, range: PhysRange) {
        // Relaxed: read after every thread is joined.
        INSTALLED.fetch_add(range.frames(), Ordering::Relaxed);
    }
}

static HOOK: Counting = Counting;

/// Allocates every free block of order 9 or more but those headed by `keep_free` (order 9
/// each), and returns the blocks held.
fn hold_all_but(m: &Machine<'_>, keep_free: &[Pfn]) -> Vec<Pfn> {
    let mut held = Vec::new();
    while let Some(p) = m.alloc(node0(), Order::HUGE_2M, AllocFlags::THISNODE) {
        held.push(p);
    }
    for &p in keep_free {
        let i = held
            .iter()
            .position(|&h| h == p)
            .expect("a whole free pageblock");
        m.free(held.swap_remove(i), Order::HUGE_2M)
            .expect("own block");
    }
    held
}

/// Reports node 0 in batches of one block, collecting the blocks into `seen`.
fn report_into(m: &Machine<'_>, seen: &mut Vec<PhysRange>) -> Reported {
    m.report(node0(), Order::HUGE_2M, 1, |b| {
        seen.extend_from_slice(b);
        true
    })
    .expect("a good call")
}

/// At three preemptions (785 executions, under a second; every outcome below occurs): an allocation
/// of the one free pageblock races its report. Either the allocation gets it (before the report
/// takes it, or after the report put it back marked, and then the mark is gone and the install
/// hook ran on it), or it finds nothing while the host holds it.
#[test]
fn report_races_an_allocation() {
    model_up_to(3, || {
        INSTALLED.store(0, Ordering::Relaxed);
        let tiny = keep(Tiny::one_node(
            PhysRange::new(Pfn::new(0), Pfn::new(4 * PB)).expect("ordered"),
        ));
        let mem = keep(SparseMem::default());
        let m = Arc::new(tiny.boot(mem).with_install(&HOOK));
        let free = Pfn::new(0);
        let held = hold_all_but(&m, &[free]);
        let steps = Arc::new(Steps::default());

        let reporter = {
            let (m, steps) = (m.clone(), steps.clone());
            spawn(move || {
                steps.next();
                let mut seen = Vec::new();
                let done = report_into(&m, &mut seen);
                (done, seen)
            })
        };
        steps.next();
        let got = m.alloc(node0(), Order::HUGE_2M, AllocFlags::THISNODE);
        let (done, seen) = reporter.join().expect("reporter");

        let block = PhysRange::new(free, Pfn::new(PB)).expect("ordered");
        assert!(seen.is_empty() || seen == [block], "{seen:?}");
        assert_eq!(done.blocks, seen.len() as u64);
        m.check_invariants().expect("invariants");
        match got {
            Some(p) => {
                assert_eq!(p, free);
                assert_eq!(reported(&m), 0, "allocated: no mark left");
                // The hook ran exactly when the block was reported before the allocation.
                assert_eq!(INSTALLED.load(Ordering::Relaxed), done.frames);
                m.free(p, Order::HUGE_2M).expect("own block");
                assert_eq!(reported(&m), 0, "freed: unreported again");
            }
            None => {
                assert_eq!(
                    seen,
                    [block],
                    "an allocation fails only while the host holds it"
                );
                assert_eq!(reported(&m), PB);
                assert_eq!(INSTALLED.load(Ordering::Relaxed), 0);
            }
        }
        for p in held {
            m.free(p, Order::HUGE_2M).expect("own block");
        }
        m.check_invariants().expect("invariants");
    });
}

/// At three preemptions (428 executions, under a second; all three outcomes occur): a free of the buddy
/// of the pageblock being reported. The two merge either before the report (which then reports
/// the merged 4 MiB block) or when the report puts its block back; a merge with the unreported
/// buddy leaves the merged block unreported, and the same call reports it again as a whole.
/// Either way the call ends with the merged block reported, and nothing else.
#[test]
fn report_races_a_free_of_the_buddy() {
    model_up_to(3, || {
        let tiny = keep(Tiny::one_node(
            PhysRange::new(Pfn::new(0), Pfn::new(4 * PB)).expect("ordered"),
        ));
        let mem = keep(SparseMem::default());
        let m = Arc::new(tiny.boot(mem));
        let (free, buddy) = (Pfn::new(0), Pfn::new(PB));
        let held = hold_all_but(&m, &[free]);
        assert!(held.contains(&buddy));
        let steps = Arc::new(Steps::default());

        let reporter = {
            let (m, steps) = (m.clone(), steps.clone());
            spawn(move || {
                steps.next();
                let mut seen = Vec::new();
                let done = report_into(&m, &mut seen);
                (done, seen)
            })
        };
        steps.next();
        m.free(buddy, Order::HUGE_2M).expect("own block");
        let (_, seen) = reporter.join().expect("reporter");

        let pb = PhysRange::new(free, Pfn::new(PB)).expect("ordered");
        let merged = PhysRange::new(free, Pfn::new(2 * PB)).expect("ordered");
        m.check_invariants().expect("invariants");
        let zone = m.node(node0()).expect("node 0").zone(ZoneKind::Dma32);
        assert_eq!(zone.buddyinfo()[10], 1, "the two pageblocks merged");
        match seen.as_slice() {
            // The free came first, or while the report held its block.
            [b] if *b == merged => assert_eq!(reported(&m), 2 * PB),
            [b, c] if *b == pb && *c == merged => assert_eq!(reported(&m), 2 * PB),
            // The report ended before the free: the merge is unreported.
            [b] if *b == pb => assert_eq!(reported(&m), 0),
            other => panic!("reported {other:?}"),
        }
        for p in held.into_iter().filter(|&p| p != buddy) {
            m.free(p, Order::HUGE_2M).expect("own block");
        }
        m.check_invariants().expect("invariants");
    });
}
