//! A per-CPU free that misses the CPU's last span (the CPU's first free, or a frame of another
//! span) looks the frame up in the layout while it holds the CPU's cache lock. These models race
//! such frees against a hot-add publishing a new layout, and against an allocation through the
//! same CPU, which takes that cache lock and reads the layout too.
//!
//! It matters because the lookup nests a layout read inside the cache lock: if the layout read
//! ever waited for a hot-add that itself waits (or lets a waiting writer block readers) while
//! an allocation holds the layout and wants the cache lock, the three would deadlock. The
//! core's reader-writer lock is writer-preferring under loom too, so loom reports such a
//! deadlock as a failure. In every interleaving the free succeeds into the frame's zone, the
//! allocation gets a frame of the CPU's node, the hot-add lands, and afterwards every frame is
//! free exactly once.
//!
//! With the pageblock lending of the per-CPU caches these models cost far more than they did:
//! the three-thread model runs at one preemption (119,401 executions, about two and a half
//! minutes), and the refused free at two (13,106 executions, 14 s; 90 s at three).
#![cfg(numaframe_loom)]

use loom::sync::Arc;
use numaframe::zonelist::FallbackOptions;
use numaframe::{AllocFlags, FreeError, Machine, NodeId, Order, PcpConfig, Pfn, PhysRange};
use numaframe_loom::{
    SparseMem, Steps, Thread, Tiny, assert_all_free, keep, model, model_up_to, spawn,
};

const FRAMES: u64 = 64;
const N0: NodeId = NodeId::new(0);
const N1: NodeId = NodeId::new(1);

/// Nodes 0 and 1 have a span each; CPU 0 is on node 0. Returns the machine, its memory and a
/// node-1 frame that CPU 0's next free misses its last span with: none at all if `first` (the
/// CPU's first free), node 0's span otherwise.
fn setup(first: bool) -> (Arc<Machine<'static>>, &'static SparseMem, Pfn) {
    let tiny = keep(Tiny::new(2, FRAMES, &[]));
    let mem = keep(SparseMem::default());
    let m = tiny.boot_with_cpus(mem, &[N0], PcpConfig { batch: 2, high: 4 });
    let c0 = m.cpu(0).expect("cpu 0");
    if !first {
        let p0 = m
            .alloc(N0, Order::ZERO, AllocFlags::THISNODE)
            .expect("memory");
        m.free_cpu(c0, p0, Order::ZERO).expect("own frame");
        m.drain_all();
    }
    let p1 = m
        .alloc(N1, Order::ZERO, AllocFlags::THISNODE)
        .expect("memory");
    (Arc::new(m), mem, p1)
}

/// Spawns the hot-add of a second span for node 1, after the range Tiny gives the nodes.
fn spawn_hot_add(
    m: &Arc<Machine<'static>>,
    mem: &'static SparseMem,
    steps: &Arc<Steps>,
) -> Thread<()> {
    let (m, steps) = (m.clone(), steps.clone());
    spawn(move || {
        let range = PhysRange::new(Pfn::new(2 * FRAMES), Pfn::new(3 * FRAMES)).expect("ordered");
        steps.next();
        m.hot_add(mem, N1, range, FallbackOptions::default())
            .expect("hot-add of a free range");
    })
}

/// Checks that every frame is free exactly once and that the hot-add landed.
fn settle(m: &Machine<'_>) {
    assert_all_free(m);
    assert_eq!(
        m.node_of(Pfn::new(2 * FRAMES)),
        Some(N1),
        "the hot-add landed"
    );
}

/// CPU 0 frees the node-1 frame while node 1 gets a second span.
fn free_races_hot_add(first: bool) {
    model(move || {
        let (m, mem, p1) = setup(first);
        let steps = Arc::new(Steps::default());
        let adder = spawn_hot_add(&m, mem, &steps);
        steps.next();
        m.free_cpu(m.cpu(0).expect("cpu 0"), p1, Order::ZERO)
            .expect("own frame outside the last span");
        adder.join().expect("adder");
        settle(&m);
    });
}

#[test]
fn first_free_races_hot_add() {
    free_races_hot_add(true);
}

#[test]
fn free_in_another_span_races_hot_add() {
    free_races_hot_add(false);
}

/// The free and the hot-add of `free_races_hot_add` (the CPU's first free), and an order-0
/// allocation through CPU 0 (its cache is empty, so it walks the zonelist and refills under
/// the same cache lock) on a third thread.
#[test]
fn missed_free_races_hot_add_and_an_allocation_on_the_same_cpu() {
    model_up_to(1, || {
        let (m, mem, p1) = setup(true);
        let steps = Arc::new(Steps::default());
        let c0 = m.cpu(0).expect("cpu 0");
        let freer = {
            let (m, steps) = (m.clone(), steps.clone());
            spawn(move || {
                steps.next();
                m.free_cpu(c0, p1, Order::ZERO)
                    .expect("own frame outside the last span");
            })
        };
        let adder = spawn_hot_add(&m, mem, &steps);
        steps.next();
        let q = m
            .alloc_cpu(c0, Order::ZERO, AllocFlags::empty())
            .expect("node 0 has free frames");
        assert_eq!(m.node_of(q), Some(N0), "CPU 0 allocates locally");
        freer.join().expect("freer");
        adder.join().expect("adder");
        m.free_cpu(c0, q, Order::ZERO).expect("own frame");
        settle(&m);
    });
}

/// A caller frees, through CPU 0, a frame of the range node 1 is getting (a bug: it never had
/// it) while the hot-add runs. The lookup may find the new span in the layout before the span
/// has joined its zone, and then searches the zone's span list while the hot-add appends to it.
/// In every interleaving the free is refused with a typed error naming the frame, and changes
/// nothing.
#[test]
fn free_of_a_frame_being_hot_added_is_refused() {
    model_up_to(2, || {
        let (m, mem, p1) = setup(true);
        m.free(p1, Order::ZERO).expect("own frame");
        let steps = Arc::new(Steps::default());
        let adder = spawn_hot_add(&m, mem, &steps);
        let stranger = Pfn::new(2 * FRAMES);
        steps.next();
        let err = m
            .free_cpu(m.cpu(0).expect("cpu 0"), stranger, Order::ZERO)
            .expect_err("never allocated");
        assert!(
            matches!(
                err,
                FreeError::Foreign { pfn } | FreeError::DoubleFree { pfn } | FreeError::NotAllocated { pfn }
                    if pfn == stranger
            ),
            "{err:?}"
        );
        adder.join().expect("adder");
        settle(&m);
    });
}
