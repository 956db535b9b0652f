//! Memory offlining racing the paths that touch the range it takes away: an allocation that
//! can only be served from the range, a free of a frame of it, and a per-CPU free of a frame
//! of a pageblock that CPU caches. Offlining isolates the range under its zone lock, drains the
//! caches, checks that every frame is free, and republishes the layout; whatever the order, the
//! range leaves exactly when nothing of it was in use at the check, a refusal names the frame in
//! use and leaves the range usable, and afterwards every frame is accounted for (a retry after
//! the free succeeds, and a free of the range's frames is then refused as foreign).
//!
//! The machine is Tiny's two nodes: node 0's memory taken by the model before the threads
//! start (so node 1 is the only memory an allocation can find), and node 1 memoryless until
//! the model hot-adds its range.
#![cfg(numaframe_loom)]

use std::sync::atomic::{AtomicU8, Ordering};

use loom::sync::Arc;
use numaframe::zonelist::FallbackOptions;
use numaframe::{
    AllocFlags, FreeError, Machine, NodeId, OfflineError, OfflineOptions, Order, PcpConfig, Pfn,
    PhysRange,
};
use numaframe_loom::{SparseMem, Tiny, assert_all_free, keep, leave_free, model_up_to, race};

const FRAMES: u64 = 64;

fn n0() -> NodeId {
    NodeId::new(0)
}

fn n1() -> NodeId {
    NodeId::new(1)
}

/// The outcomes one model saw over all its executions, one bit each (loom runs the executions
/// one after the other on the model's test thread; each model has its own).
struct Seen(AtomicU8);

impl Seen {
    const fn new() -> Seen {
        Seen(AtomicU8::new(0))
    }

    fn saw(&self, outcome: u8) {
        // Relaxed: read once the model has run every execution.
        self.0.fetch_or(1 << outcome, Ordering::Relaxed);
    }

    fn all(&self) -> u8 {
        // Relaxed: as above.
        self.0.load(Ordering::Relaxed)
    }
}

/// Node 1's slot in Tiny's layout.
fn slot() -> PhysRange {
    PhysRange::new(Pfn::new(FRAMES), Pfn::new(2 * FRAMES)).expect("ordered")
}

/// Boots Tiny's two nodes (node 1 memoryless, CPU 0 on node 0 with `pcp`), takes all of node
/// 0's memory, and hot-adds node 1's range. Returns the machine, its memory and node 0's
/// blocks.
fn world(pcp: PcpConfig) -> (Arc<Machine<'static>>, &'static SparseMem, Vec<(Pfn, Order)>) {
    let tiny = keep(Tiny::new(2, FRAMES, &[1]));
    let mem = keep(SparseMem::default());
    let m = tiny.boot_with_cpus(mem, &[n0()], pcp);
    let held = leave_free(&m, n0(), 0);
    m.hot_add(mem, n1(), slot(), FallbackOptions::default())
        .expect("hot-add");
    (Arc::new(m), mem, held)
}

/// Ends a model: the range is offline (after a retry if the race refused it), node 1 is
/// memoryless, frees of its frames are foreign, and every frame of node 0 comes back.
fn end(m: &Machine<'_>, mem: &SparseMem, first: Result<(), OfflineError>, held: &[(Pfn, Order)]) {
    if first.is_err() {
        m.offline(mem, slot(), OfflineOptions::default())
            .expect("nothing of the range is in use any more");
    }
    m.check_invariants().expect("invariants");
    assert!(!m.memory_nodes().contains(n1()));
    assert_eq!(m.node(n1()).expect("node 1").managed_pages(), 0);
    let p = slot().start();
    assert_eq!(m.free(p, Order::ZERO), Err(FreeError::Foreign { pfn: p }));
    for &(p, order) in held {
        m.free(p, order).expect("own block");
    }
    assert_all_free(m);
}

/// At one preemption (about 8 s; two take over three minutes), every outcome below occurs:
/// an allocation that can only land in the range races its offlining.
/// Either the allocation finds nothing (the range is isolated or gone), or it gets a frame of
/// node 1; then the offline is refused naming that frame, unless the frame was freed before
/// the offline checked the range.
#[test]
fn offline_races_an_allocation() {
    static SEEN: Seen = Seen::new();
    model_up_to(1, || {
        let (m, mem, held) = world(PcpConfig::OFF);
        let (got, off) = race(
            {
                let m = m.clone();
                move || m.offline(mem, slot(), OfflineOptions::default())
            },
            || {
                let p = m.alloc(n0(), Order::ZERO, AllocFlags::empty());
                if let Some(p) = p {
                    assert!(slot().contains(p), "frame {p:?} outside node 1");
                    m.free(p, Order::ZERO).expect("own frame");
                }
                p
            },
        );
        match (got, off) {
            (None, Ok(())) => SEEN.saw(0),
            (Some(_), Ok(())) => SEEN.saw(1),
            (Some(p), Err(OfflineError::Busy { busy: 1, pfn })) => {
                assert_eq!(pfn, p);
                SEEN.saw(2);
            }
            other => panic!("unexpected outcome {other:?}"),
        }
        end(&m, mem, off, &held);
    });
    assert_eq!(SEEN.all(), 0b111, "every outcome occurs");
}

/// At two preemptions (under a second), both outcomes occur: the free of a frame of the range
/// races its offlining. The free always
/// succeeds (the frame is in use until it runs); the offline succeeds exactly when it checked
/// the range after the free, and otherwise names the frame.
#[test]
fn offline_races_a_free() {
    static SEEN: Seen = Seen::new();
    model_up_to(2, || {
        let (m, mem, held) = world(PcpConfig::OFF);
        let p = m
            .alloc(n0(), Order::ZERO, AllocFlags::empty())
            .expect("node 1's memory");
        let (freed, off) = race(
            {
                let m = m.clone();
                move || m.offline(mem, slot(), OfflineOptions::default())
            },
            || m.free(p, Order::ZERO),
        );
        assert_eq!(freed, Ok(()));
        match off {
            Ok(()) => SEEN.saw(0),
            Err(OfflineError::Busy { busy: 1, pfn }) => {
                assert_eq!(pfn, p);
                SEEN.saw(1);
            }
            Err(e) => panic!("unexpected refusal {e:?}"),
        }
        end(&m, mem, off, &held);
    });
    assert_eq!(SEEN.all(), 0b11, "both outcomes occur");
}

/// At two preemptions (under a second), both outcomes occur: CPU 0 caches a pageblock of the
/// range (node 0 has nothing left, so its
/// cache borrows from node 1) and frees a frame of it while the range goes offline. The
/// offline drains the cache under the CPU's lock: the free lands in the cache before the drain
/// or goes to the zone after it, and is never lost; the offline succeeds exactly when it
/// checked the range after the free.
#[test]
fn offline_races_a_per_cpu_free() {
    static SEEN: Seen = Seen::new();
    model_up_to(2, || {
        let (m, mem, held) = world(PcpConfig { batch: 1, high: 64 });
        let cpu = m.cpu(0).expect("cpu 0");
        let p = m
            .alloc_cpu(cpu, Order::ZERO, AllocFlags::empty())
            .expect("node 1's memory");
        assert!(slot().contains(p));
        assert!(m.cached_pages() > 0, "the pageblock is lent to the CPU");
        let (freed, off) = race(
            {
                let m = m.clone();
                move || m.offline(mem, slot(), OfflineOptions::default())
            },
            || m.free_cpu(cpu, p, Order::ZERO),
        );
        assert_eq!(freed, Ok(()));
        match off {
            Ok(()) => SEEN.saw(0),
            Err(OfflineError::Busy { busy: 1, pfn }) => {
                assert_eq!(pfn, p);
                SEEN.saw(1);
            }
            Err(e) => panic!("unexpected refusal {e:?}"),
        }
        assert_eq!(m.cached_pages(), 0, "nothing of the range stays cached");
        end(&m, mem, off, &held);
    });
    assert_eq!(SEEN.all(), 0b11, "both outcomes occur");
}

/// At two preemptions, both outcomes occur: CPU 0's cache holds a pageblock of the range, and
/// a `CpuHandle` claims the CPU, frees a frame of it and drops while the range goes offline. A
/// claimed cache cannot be drained from outside: the drain posts a request, and the pageblock
/// counts as busy until the handle honours it (at the latest when it drops). So the offline
/// succeeds only when the handle was gone before the drain, and otherwise names the
/// pageblock's first frame; either way nothing of the range stays cached once the handle is
/// gone.
#[test]
fn offline_races_a_claimed_cpu() {
    static SEEN: Seen = Seen::new();
    model_up_to(2, || {
        let (m, mem, held) = world(PcpConfig { batch: 1, high: 64 });
        let cpu = m.cpu(0).expect("cpu 0");
        let p = m
            .alloc_cpu(cpu, Order::ZERO, AllocFlags::empty())
            .expect("node 1's memory");
        let (freed, off) = race(
            {
                let m = m.clone();
                move || m.offline(mem, slot(), OfflineOptions::default())
            },
            || {
                let mut h = m.claim_cpu(cpu).expect("nobody else claims it");
                h.free(p, Order::ZERO)
            },
        );
        assert_eq!(freed, Ok(()));
        match off {
            Ok(()) => SEEN.saw(0),
            Err(OfflineError::Busy { busy: 1, pfn }) => {
                assert!(slot().contains(pfn) && pfn <= p);
                SEEN.saw(1);
            }
            Err(e) => panic!("unexpected refusal {e:?}"),
        }
        assert_eq!(m.cached_pages(), 0, "nothing of the range stays cached");
        end(&m, mem, off, &held);
    });
    assert_eq!(SEEN.all(), 0b11, "both outcomes occur");
}
