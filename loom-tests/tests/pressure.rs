//! The pressure drain: an allocation whose walk finds every zone empty while per-CPU caches
//! hold frames drains those caches and walks once more, so cached frames never make an
//! allocation fail (the promise of `percpu`). These models race that retry against what can
//! take the drained frames away or move frames meanwhile: the cache owner's own allocations
//! and frees (a refill, or a free sent to the zone because of the pressure), and a second
//! failing allocation running the same drain.
//!
//! In each model node 0's zone is empty and CPU 0's cache holds the only free frames, so every
//! allocation that the frames can serve must succeed, whichever way the threads interleave.
#![cfg(numaframe_loom)]

use loom::sync::Arc;
use numaframe::{AllocFlags, Machine, NodeId, Order, PcpConfig, Pfn};
use numaframe_loom::{Tiny, assert_all_free, leave_free, model, model_up_to, spawn};

const N0: NodeId = NodeId::new(0);

/// A machine whose node 0 has no free frame in its zone and `cached` frames in CPU 0's cache
/// (CPU 1 has none); returns it with the blocks held to get there.
fn cached_only(cached: u32) -> (Arc<Machine<'static>>, Vec<(Pfn, Order)>) {
    let pcp = PcpConfig {
        batch: cached,
        high: cached,
    };
    let m = Tiny::new(1, 64, &[]).boot_kept_with_cpus(&[N0, N0], pcp);
    let held = leave_free(&m, N0, u64::from(cached));
    let c0 = m.cpu(0).expect("cpu 0");
    // The zone lends CPU 0 the pageblock with the `cached` free frames; the free puts the
    // popped frame back, which leaves no more than `high` free.
    let p = m
        .alloc_cpu(c0, Order::ZERO, AllocFlags::empty())
        .expect("free frames");
    m.free_cpu(c0, p, Order::ZERO).expect("own frame");
    assert_eq!(m.cached_pages(), u64::from(cached));
    assert_eq!(m.node(N0).expect("node 0").free_pages(), 0);
    (Arc::new(m), held)
}

/// Gives everything back and checks that every frame of node 0 is free again.
fn settle(m: &Machine<'_>, held: Vec<(Pfn, Order)>, got: &[Pfn]) {
    let c1 = m.cpu(1).expect("cpu 1");
    for &p in got {
        m.free_cpu(c1, p, Order::ZERO).expect("own frame");
    }
    for (p, order) in held {
        m.free(p, order).expect("own block");
    }
    assert_all_free(m);
}

/// CPU 1 allocates (its walk fails, it drains CPU 0's cache and retries) while CPU 0 takes
/// a cached frame. Two frames, two allocations: both succeed.
#[test]
fn retry_drain_races_the_owners_allocation() {
    model(|| {
        let (m, held) = cached_only(2);
        let owner = {
            let m = m.clone();
            spawn(move || {
                m.alloc_cpu(m.cpu(0).expect("cpu 0"), Order::ZERO, AllocFlags::empty())
                    .expect("a cached or drained frame")
            })
        };
        let mine = m
            .alloc_cpu(m.cpu(1).expect("cpu 1"), Order::ZERO, AllocFlags::empty())
            .expect("frames exist only in a cache: the drain must find one");
        let theirs = owner.join().expect("owner");
        assert_ne!(mine, theirs, "one frame handed out twice");
        settle(&m, held, &[mine, theirs]);
    });
}

/// CPU 1 allocates (its walk fails, it drains CPU 0's cache and retries) while CPU 0 takes a
/// cached frame, gives it back and takes one again (a refill if the drain emptied its cache).
/// Two frames, at most two held at once: every allocation succeeds.
#[test]
fn retry_drain_races_the_owners_refill() {
    model(|| {
        let (m, held) = cached_only(2);
        let owner = {
            let m = m.clone();
            spawn(move || {
                let c0 = m.cpu(0).expect("cpu 0");
                let p = m
                    .alloc_cpu(c0, Order::ZERO, AllocFlags::empty())
                    .expect("a cached or drained frame");
                m.free_cpu(c0, p, Order::ZERO).expect("own frame");
                m.alloc_cpu(c0, Order::ZERO, AllocFlags::empty())
                    .expect("a cached or drained frame")
            })
        };
        let c1 = m.cpu(1).expect("cpu 1");
        let mine = m
            .alloc_cpu(c1, Order::ZERO, AllocFlags::empty())
            .expect("frames exist only in a cache: the drain must find one");
        let theirs = owner.join().expect("owner");
        assert_ne!(mine, theirs, "one frame handed out twice");
        settle(&m, held, &[mine, theirs]);
    });
}

/// Two allocations fail their walks at once while CPU 0's cache holds two frames: both drain
/// and retry. One drain empties the cache into the zone; the other must still retry (and find
/// the frame the first left in the zone).
///
/// At two preemptions (7,738 executions, 21 s): three ran for more than four minutes.
#[test]
fn two_failing_walks_share_one_drain() {
    model_up_to(2, || {
        let (m, held) = cached_only(2);
        let other = {
            let m = m.clone();
            spawn(move || m.alloc(N0, Order::ZERO, AllocFlags::empty()))
        };
        let mine = m.alloc(N0, Order::ZERO, AllocFlags::empty());
        let theirs = other.join().expect("thread");
        let (Some(mine), Some(theirs)) = (mine, theirs) else {
            panic!("two cached frames, two allocations: {mine:?} {theirs:?}");
        };
        assert_ne!(mine, theirs, "one frame handed out twice");
        settle(&m, held, &[mine, theirs]);
    });
}
