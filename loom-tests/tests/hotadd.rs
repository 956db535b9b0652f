//! Memory hot-add racing everything that reads the layout it republishes: an allocation (which
//! sees the old fallback list or the new one, never a torn one), frees of every kind,
//! `check_invariants`, a run-time huge-page reservation, and a second hot-add. Hot-add runs at
//! any time on a live machine, so none of these may see a half-published layout, fail
//! spuriously, or lose a frame; two hot-adds of overlapping memory must not both land.
//!
//! In the first model node 0 is exhausted before the threads start and node 1 is memoryless,
//! so the only memory an allocation can find is the range being hot-added to node 1. Under the
//! old lists (node 0: `0`) the allocation fails; under the new ones (node 0: `0 1`) it may
//! succeed, on node 1 only.
#![cfg(numaframe_loom)]

use loom::sync::Arc;
use numaframe::zonelist::FallbackOptions;
use numaframe::{AllocFlags, BootError, HugeSize, NodeId, Order, PcpConfig, Pfn, PhysRange};
use numaframe_loom::{
    SparseMem, Steps, Tiny, assert_all_free, keep, leave_free, model, model_up_to, spawn,
};

const FRAMES: u64 = 64;

fn order_of(m: &numaframe::Machine<'_>, node: usize) -> Vec<usize> {
    let mut row = [NodeId::default(); 2];
    let len = m.fallback_order(NodeId::new(node), &mut row);
    row[..len].iter().map(|n| n.index()).collect()
}

/// At one preemption (about a minute): a hot-add that gives a memoryless node its first memory
/// republishes every fallback list while the walk reads them. The frame the allocation gets is
/// freed after the join: a free racing a hot-add has models of its own, and racing the
/// allocation and its free with the hot-add took 35 times as long (about 20 minutes).
#[test]
fn hot_add_races_an_allocation() {
    model_up_to(1, || {
        let tiny = keep(Tiny::new(2, FRAMES, &[1]));
        let mem = keep(SparseMem::default());
        let m = Arc::new(tiny.boot(mem));
        let (n0, n1) = (NodeId::new(0), NodeId::new(1));

        let held = leave_free(&m, n0, 0);
        assert_eq!(m.node(n0).expect("node 0").free_pages(), 0);
        assert_eq!(order_of(&m, 0), [0]);
        assert_eq!(order_of(&m, 1), [0]);

        let adder = {
            let m = m.clone();
            spawn(move || {
                // Node 1's slot in Tiny's layout, left empty at boot.
                let range =
                    PhysRange::new(Pfn::new(FRAMES), Pfn::new(2 * FRAMES)).expect("ordered");
                m.hot_add(mem, n1, range, FallbackOptions::default())
                    .expect("hot-add");
            })
        };
        let seen = order_of(&m, 0);
        assert!(seen == [0] || seen == [0, 1], "torn list {seen:?}");
        // The old list: node 0 only, and it is empty (`None`). The new list: the only free
        // memory is the hot-added range on node 1.
        let got = m.alloc(n0, Order::ZERO, AllocFlags::empty());
        if let Some(p) = got {
            assert_eq!(m.node_of(p), Some(n1), "frame {p:?} from the wrong node");
        }
        if seen == [0, 1] {
            // Lists only ever grow here: once the new list is seen, it stays.
            assert_eq!(order_of(&m, 0), [0, 1]);
        }
        adder.join().expect("adder");
        // A free racing a hot-add has models of its own (`hot_add_races_a_plain_free`).
        if let Some(p) = got {
            m.free(p, Order::ZERO).expect("own frame");
        }

        m.check_invariants().expect("invariants");
        assert_eq!(order_of(&m, 0), [0, 1]);
        assert_eq!(order_of(&m, 1), [1, 0]);
        let node1 = m.node(n1).expect("node 1");
        assert!(node1.managed_pages() > 0);
        assert_eq!(
            node1.free_pages(),
            node1.managed_pages(),
            "the frame came back"
        );
        for (p, order) in held {
            m.free(p, order).expect("own block");
        }
        m.check_invariants().expect("invariants");
    });
}

/// Boots Tiny's two nodes with node 1 memoryless and CPU 0 on node 0, with `held` order-0
/// frames allocated on node 0.
fn two_nodes(
    held: usize,
) -> (
    Arc<numaframe::Machine<'static>>,
    &'static SparseMem,
    Vec<Pfn>,
) {
    let tiny = keep(Tiny::new(2, FRAMES, &[1]));
    let mem = keep(SparseMem::default());
    let m = tiny.boot_with_cpus(mem, &[NodeId::new(0)], PcpConfig { batch: 1, high: 2 });
    let frames = (0..held)
        .map(|_| {
            m.alloc(NodeId::new(0), Order::ZERO, AllocFlags::THISNODE)
                .expect("memory")
        })
        .collect();
    (Arc::new(m), mem, frames)
}

/// Node 1's slot in Tiny's layout, `frames` long from `offset` frames in.
fn slot(offset: u64, frames: u64) -> PhysRange {
    PhysRange::new(
        Pfn::new(FRAMES + offset),
        Pfn::new(FRAMES + offset + frames),
    )
    .expect("ordered")
}

/// Node 1 is hot-added while `free` frees frames of node 0: each succeeds into node 0,
/// whichever layout it reads. (The frees of every kind raced one hot-add together in one model
/// once; with the new core that cost 155,000 executions at two preemptions, so each kind now
/// races a hot-add of its own at three.)
fn hot_add_races_a_free(frames: usize, free: fn(&numaframe::Machine<'_>, &[Pfn])) {
    model(move || {
        let (m, mem, f) = two_nodes(frames);
        let steps = Arc::new(Steps::default());
        let adder = {
            let (m, steps) = (m.clone(), steps.clone());
            spawn(move || {
                steps.next();
                m.hot_add(
                    mem,
                    NodeId::new(1),
                    slot(0, FRAMES),
                    FallbackOptions::default(),
                )
                .expect("hot-add");
            })
        };
        steps.next();
        free(&m, &f);
        adder.join().expect("adder");
        assert_eq!(order_of(&m, 0), [0, 1]);
        assert_all_free(&m);
    });
}

#[test]
fn hot_add_races_a_plain_free() {
    hot_add_races_a_free(1, |m, f| m.free(f[0], Order::ZERO).expect("own frame"));
}

/// CPU 0's first per-CPU free looks its span up in the layout being republished.
#[test]
fn hot_add_races_a_per_cpu_free() {
    hot_add_races_a_free(1, |m, f| {
        m.free_cpu(m.cpu(0).expect("cpu 0"), f[0], Order::ZERO)
            .expect("own frame")
    });
}

#[test]
fn hot_add_races_a_bulk_free() {
    hot_add_races_a_free(2, |m, f| m.free_bulk(f).expect("own frames"));
}

/// `check_invariants` while node 1 is hot-added: it never reports an inconsistency, whichever
/// step of the hot-add it overlaps.
#[test]
fn hot_add_races_check_invariants() {
    model(|| {
        let (m, mem, _) = two_nodes(0);
        let adder = {
            let m = m.clone();
            spawn(move || {
                m.hot_add(
                    mem,
                    NodeId::new(1),
                    slot(0, FRAMES),
                    FallbackOptions::default(),
                )
                .expect("hot-add");
            })
        };
        m.check_invariants().expect("no spurious invariant error");
        adder.join().expect("adder");
        assert_all_free(&m);
    });
}

/// A run-time huge-page reservation on node 1 while node 1 gets the only memory that can hold
/// a 2 MiB page: it reserves nothing (before the span joins the zone) or the one page, and the
/// pool and the zone agree afterwards.
#[test]
fn hot_add_races_reserve_huge() {
    model(|| {
        let (m, mem, _) = two_nodes(0);
        let n1 = NodeId::new(1);
        // 1024 frames from the first 2 MiB boundary above node 0: one aligned 2 MiB block
        // once the span's metadata is carved off its end.
        let range = PhysRange::new(Pfn::new(1024), Pfn::new(2048)).expect("ordered");
        let adder = {
            let m = m.clone();
            spawn(move || {
                m.hot_add(mem, n1, range, FallbackOptions::default())
                    .expect("hot-add");
            })
        };
        let got = m.reserve_huge(n1, HugeSize::Size2M, 1);
        adder.join().expect("adder");
        assert!(got <= 1);
        let pool = m.huge_counts(n1, HugeSize::Size2M);
        assert_eq!((pool.total, pool.free), (got, got));
        let node = m.node(n1).expect("node 1");
        assert_eq!(node.free_pages() + 512 * got, node.managed_pages());
        assert_eq!(m.release_huge(n1, HugeSize::Size2M, 1), got);
        assert_all_free(&m);
    });
}

/// The frames node 1 manages once `r` alone is hot-added to a fresh machine: each span gives
/// up the end of its range to its own metadata, however it races.
fn managed_alone(r: PhysRange) -> u64 {
    let (m, mem, _) = two_nodes(0);
    let n1 = NodeId::new(1);
    m.hot_add(mem, n1, r, FallbackOptions::default())
        .expect("hot-add");
    m.node(n1).expect("node 1").managed_pages()
}

/// Two hot-adds at once, into node 1's slot. Disjoint halves both land, and node 1 manages
/// what each manages alone; overlapping ranges land one: the other fails with `Overlap` naming
/// its own start, and changes nothing.
fn two_hot_adds(a: PhysRange, b: PhysRange) {
    model(move || {
        let (m, mem, _) = two_nodes(0);
        let n1 = NodeId::new(1);
        let other = {
            let m = m.clone();
            spawn(move || m.hot_add(mem, n1, b, FallbackOptions::default()))
        };
        let mine = m.hot_add(mem, n1, a, FallbackOptions::default());
        let theirs = other.join().expect("thread");
        let managed = m.node(n1).expect("node 1").managed_pages();
        if a.overlaps(&b) {
            match (mine, theirs) {
                (Ok(()), Err(BootError::Overlap { start })) => {
                    assert_eq!(start, b.start());
                    assert_eq!(managed, managed_alone(a));
                }
                (Err(BootError::Overlap { start }), Ok(())) => {
                    assert_eq!(start, a.start());
                    assert_eq!(managed, managed_alone(b));
                }
                other => panic!("exactly one overlapping hot-add lands: {other:?}"),
            }
        } else {
            assert_eq!((mine, theirs), (Ok(()), Ok(())));
            assert_eq!(managed, managed_alone(a) + managed_alone(b));
        }
        assert_eq!(order_of(&m, 0), [0, 1]);
        assert_eq!(order_of(&m, 1), [1, 0]);
        assert_all_free(&m);
    });
}

#[test]
fn disjoint_hot_adds_both_land() {
    two_hot_adds(slot(0, FRAMES / 2), slot(FRAMES / 2, FRAMES / 2));
}

#[test]
fn overlapping_hot_adds_land_one() {
    two_hot_adds(slot(0, FRAMES / 2), slot(FRAMES / 4, FRAMES / 2));
}

/// An allocation whose walk finds every zone empty while a CPU's cache holds the only free
/// frames drains the cache and walks once more (docs/promises.md: "cached frames never make
/// an allocation fail"); a hot-add racing that retry must leave it the old list or the new one,
/// "never a torn one". Node 0's list is `0 1` before node 2 gets memory and `0 2 1` after (node
/// 2 is nearer); node 2's new memory is above 4 GiB, so the DMA32 request can use only node
/// 1's drained frames, under either list.
#[test]
fn hot_add_races_the_pressure_retry() {
    model_up_to(1, || {
        let mut tiny = Tiny::new(3, FRAMES, &[2]);
        tiny.distances = vec![10, 20, 15, 20, 10, 20, 15, 20, 10];
        let tiny = keep(tiny);
        let mem = keep(SparseMem::default());
        let pcp = PcpConfig { batch: 2, high: 2 };
        let (n0, n1, n2) = (NodeId::new(0), NodeId::new(1), NodeId::new(2));
        let m = Arc::new(tiny.boot_with_cpus(mem, &[n0, n1], pcp));
        let mut held = leave_free(&m, n0, 0);
        held.extend(leave_free(&m, n1, 2));
        // CPU 1 borrows node 1's pageblock with its two free frames.
        let c1 = m.cpu(1).expect("cpu 1");
        let p = m
            .alloc_cpu(c1, Order::ZERO, AllocFlags::empty())
            .expect("free frames");
        m.free_cpu(c1, p, Order::ZERO).expect("own frame");
        assert_eq!(m.cached_pages(), 2);
        assert_eq!(m.node(n1).expect("node 1").free_pages(), 0);
        let mut row = [NodeId::default(); 3];
        assert_eq!(m.fallback_order(n0, &mut row), 2);

        let adder = {
            let m = m.clone();
            spawn(move || {
                let above = PhysRange::new(Pfn::new(1 << 20), Pfn::new((1 << 20) + FRAMES))
                    .expect("ordered");
                m.hot_add(mem, n2, above, FallbackOptions::default())
                    .expect("hot-add");
            })
        };
        let got = m.alloc(n0, Order::ZERO, AllocFlags::DMA32);
        adder.join().expect("adder");
        let got = got.expect("node 1's drained frames serve the request under either list");
        assert_eq!(m.node_of(got), Some(n1));
        m.free(got, Order::ZERO).expect("own frame");
        for (p, order) in held {
            m.free(p, order).expect("own block");
        }
        m.check_invariants().expect("invariants");
        assert_eq!(m.fallback_order(n0, &mut row), 3);
        assert_eq!(&row, &[n0, n2, n1]);
    });
}
