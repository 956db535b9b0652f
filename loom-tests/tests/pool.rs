//! The metadata pool of a zone growing under two threads at once. Splitting a pageblock below
//! 2 MiB takes planes from its zone's pool; when the pool has none to spare, the allocation
//! drops the zone lock, takes a frame for a new slab from the zone, maps it, adds it to the
//! pool, and tries again. Here two threads each ask for a half pageblock in a node of one whole
//! section once the pool has no plane pair left: the first to try finds the pool empty and
//! grows it, and the second may find it empty too and grow it at the same time. The pool takes
//! its slabs from one pool pageblock of its own, so the metadata grows by exactly that
//! pageblock however many slabs grow; afterwards the
//! blocks are distinct, the invariants hold, and every frame is free, handed out or the pool's.
#![cfg(numaframe_loom)]

use std::sync::atomic::{AtomicUsize, Ordering};

use loom::sync::Arc;
use numaframe::{AllocFlags, Machine, NodeId, Order, PAGE_SIZE, Pfn, ZoneKind};
use numaframe_loom::{Steps, Tiny, model, spawn};

const N0: NodeId = NodeId::new(0);
/// Half a pageblock: a split pageblock serving it needs a plane pair (allocation and heads).
const HALF: Order = Order::new(8);
/// One section (1 GiB, whole) and the edge pageblock after it that holds the node's metadata
/// and the machine's tables.
const FRAMES: u64 = (1 << 18) + 512;

/// The frames of a pool pageblock.
const POOL_PAGEBLOCK: u64 = 512;

fn pool_bytes(m: &Machine<'_>) -> u64 {
    m.node(N0)
        .expect("node 0")
        .zone(ZoneKind::Dma32)
        .metadata_bytes()
}

fn half(m: &Machine<'_>) -> Pfn {
    m.alloc(N0, HALF, AllocFlags::THISNODE).expect("memory")
}

/// How many half blocks a fresh machine hands out before one of them needs the pool to grow:
/// found once, by a single-threaded run (the sequence is the same in every execution).
fn halves_until_growth() -> usize {
    static HALVES: AtomicUsize = AtomicUsize::new(0);
    model(|| {
        let m = boot();
        let start = pool_bytes(&m);
        let mut n = 0;
        while pool_bytes(&m) == start {
            half(&m);
            n += 1;
        }
        HALVES.store(n, Ordering::Relaxed);
    });
    HALVES.load(Ordering::Relaxed)
}

fn boot() -> Arc<Machine<'static>> {
    Arc::new(Tiny::new(1, FRAMES, &[]).boot_kept())
}

#[test]
fn two_splits_grow_an_empty_pool_at_once() {
    let halves = halves_until_growth();
    model(move || {
        let m = boot();
        let node = m.node(N0).expect("node 0");
        let (managed, before) = (node.managed_pages(), pool_bytes(&m));
        // The pool has no pair left: the next half block needs it to grow.
        let held: Vec<Pfn> = (1..halves).map(|_| half(&m)).collect();
        assert_eq!(pool_bytes(&m), before, "the pool has not grown yet");
        let steps = Arc::new(Steps::default());
        let other = {
            let (m, steps) = (m.clone(), steps.clone());
            spawn(move || {
                steps.next();
                half(&m)
            })
        };
        steps.next();
        let mine = half(&m);
        let theirs = other.join().expect("thread");
        assert_ne!(mine, theirs, "one block handed out twice");
        let grown = (pool_bytes(&m) - before) / PAGE_SIZE;
        assert_eq!(grown, POOL_PAGEBLOCK, "the pool took one pool pageblock");

        m.check_invariants().expect("invariants");
        let in_pool = (pool_bytes(&m) - before) / PAGE_SIZE;
        let handed_out = (held.len() as u64 + 2) * HALF.frames();
        assert_eq!(
            m.node(N0).expect("node 0").free_pages() + handed_out + in_pool,
            managed,
            "every frame is free, handed out, or a slab of the pool"
        );
    });
}
