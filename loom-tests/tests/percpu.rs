//! Per-CPU caches: a CPU's lent pageblock taken back by a remote drain while the CPU allocates
//! and frees in it, and double frees racing across CPUs (a plain free against a per-CPU one,
//! and the frame's holder against another CPU while the holder's free gives its pageblock
//! back). A double free is a caller bug the allocator promises to catch: exactly one free may
//! win, or the frame would sit in two places at once and be handed out twice.
#![cfg(numaframe_loom)]

use loom::sync::Arc;
use numaframe::{AllocFlags, FreeError, NodeId, Order, PcpConfig};
use numaframe_loom::{SparseMem, Steps, Tiny, assert_all_free, keep, leave_free, model, spawn};

const N0: NodeId = NodeId::new(0);

/// CPU 0 allocates (its zone lends it the node's one pageblock) and frees (the pageblock stays
/// lent: it keeps pageblocks until they are wholly free) while another thread drains CPU 0's
/// cache: every frame ends either in the cache or in the zone, never in both and never lost.
#[test]
fn refill_races_remote_drain() {
    model(|| {
        let tiny = keep(Tiny::new(1, 64, &[]));
        let mem = keep(SparseMem::default());
        let m = Arc::new(tiny.boot_with_cpus(mem, &[N0], PcpConfig::default()));
        let before = m.node(N0).expect("node 0").free_pages();
        let c0 = m.cpu(0).expect("cpu 0");
        let worker = {
            let m = m.clone();
            spawn(move || {
                let p = m
                    .alloc_cpu(c0, Order::ZERO, AllocFlags::empty())
                    .expect("memory");
                m.free_cpu(c0, p, Order::ZERO).expect("own frame");
            })
        };
        m.drain_cpu(c0);
        worker.join().expect("worker");
        m.check_invariants().expect("invariants");
        let node = m.node(N0).expect("node 0");
        assert_eq!(
            node.free_pages() + m.cached_pages(),
            before,
            "every frame is in a cache or its zone"
        );
        assert_all_free(&m);
    });
}

/// Two CPUs free the same frame at once (a caller bug), a frame of the pageblock CPU 0 holds:
/// CPU 1 through the zone lock and the frame's state byte, the other thread with a plain free.
/// Exactly one free wins, the other gets a typed error, and the state stays consistent.
#[test]
fn double_free_from_two_cpus() {
    model(|| {
        let tiny = keep(Tiny::new(1, 64, &[]));
        let mem = keep(SparseMem::default());
        let m = Arc::new(tiny.boot_with_cpus(mem, &[N0, N0], PcpConfig { batch: 1, high: 2 }));
        let c0 = m.cpu(0).expect("cpu 0");
        let p = m
            .alloc_cpu(c0, Order::ZERO, AllocFlags::empty())
            .expect("memory");
        let steps = Arc::new(Steps::default());
        let other = {
            let (m, steps) = (m.clone(), steps.clone());
            spawn(move || {
                steps.next();
                m.free_cpu(m.cpu(1).expect("cpu 1"), p, Order::ZERO)
            })
        };
        steps.next();
        let mine = m.free(p, Order::ZERO);
        let theirs = other.join().expect("thread");
        assert!(
            mine.is_ok() != theirs.is_ok(),
            "exactly one free wins: {mine:?} {theirs:?}"
        );
        let err = mine.err().or(theirs.err()).expect("one error");
        assert!(
            matches!(
                err,
                FreeError::DoubleFree { pfn } | FreeError::NotAllocated { pfn } if pfn == p
            ),
            "{err:?}"
        );
        assert_all_free(&m);
    });
}

/// CPU 0, which holds the frame's pageblock, and CPU 1 free the same frame at once. The
/// pageblock has three free frames and the tuning keeps at most two, so CPU 0's free, if it
/// wins, gives the pageblock back to the zone (under the zone lock) while CPU 1, which holds
/// nothing, looks the frame up through the zone lock: in a lent pageblock or a returned one.
/// Exactly one free wins, the loser gets a typed error naming the frame, and afterwards every
/// frame is free exactly once.
#[test]
fn double_free_racing_the_holders_give_back() {
    model(|| {
        let tiny = keep(Tiny::new(1, 64, &[]));
        let mem = keep(SparseMem::default());
        let m = Arc::new(tiny.boot_with_cpus(mem, &[N0, N0], PcpConfig { batch: 1, high: 2 }));
        let held = leave_free(&m, N0, 3);
        let c0 = m.cpu(0).expect("cpu 0");
        let p = m
            .alloc_cpu(c0, Order::ZERO, AllocFlags::empty())
            .expect("memory");
        assert_eq!(m.cached_pages(), 2, "CPU 0 holds the pageblock");
        let steps = Arc::new(Steps::default());
        let other = {
            let (m, steps) = (m.clone(), steps.clone());
            spawn(move || {
                steps.next();
                m.free_cpu(m.cpu(1).expect("cpu 1"), p, Order::ZERO)
            })
        };
        steps.next();
        let mine = m.free_cpu(c0, p, Order::ZERO);
        let theirs = other.join().expect("thread");
        assert!(
            mine.is_ok() != theirs.is_ok(),
            "exactly one free wins: {mine:?} {theirs:?}"
        );
        let err = mine.err().or(theirs.err()).expect("one error");
        assert!(
            matches!(
                err,
                FreeError::DoubleFree { pfn } | FreeError::NotAllocated { pfn } if pfn == p
            ),
            "{err:?}"
        );
        m.check_invariants().expect("invariants");
        for (q, order) in held {
            m.free(q, order).expect("own block");
        }
        assert_all_free(&m);
    });
}
