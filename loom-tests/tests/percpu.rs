//! Per-CPU caches: a refill racing a remote drain, and double frees racing across CPUs (a
//! plain free against a per-CPU one, and two per-CPU frees into two caches). A double free is a
//! caller bug the allocator promises to catch: exactly one free may win, or the frame would sit
//! in two places at once and be handed out twice.
#![cfg(numaframe_loom)]

use loom::sync::Arc;
use numaframe::{AllocFlags, FreeError, NodeId, Order, PcpConfig};
use numaframe_loom::{SparseMem, Steps, Tiny, keep, model, spawn};

/// CPU 0 allocates (refilling its cache) and frees while CPU 1 drains CPU 0's cache: every
/// frame ends either in a cache or in the zone, never in both and never lost.
#[test]
fn refill_races_remote_drain() {
    model(|| {
        let tiny = keep(Tiny::new(1, 64, &[]));
        let mem = keep(SparseMem::default());
        let cpus = [NodeId::new(0), NodeId::new(0)];
        let m = Arc::new(tiny.boot_with_cpus(mem, &cpus, PcpConfig { batch: 2, high: 4 }));
        let node = m.node(NodeId::new(0)).expect("node 0");
        let before = node.free_pages();
        let (c0, c1) = (m.cpu(0).expect("cpu 0"), m.cpu(1).expect("cpu 1"));
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
        let _ = c1;
        worker.join().expect("worker");
        m.check_invariants().expect("invariants");
        let node = m.node(NodeId::new(0)).expect("node 0");
        assert_eq!(
            node.free_pages() + m.cached_pages(),
            before,
            "every frame is in a cache or its zone"
        );
        m.drain_all();
        assert_eq!(m.node(NodeId::new(0)).expect("node 0").free_pages(), before);
    });
}

/// Two CPUs free the same frame at once (a caller bug): exactly one free wins, the other gets
/// a typed error, and the state stays consistent.
#[test]
fn double_free_from_two_cpus() {
    model(|| {
        let tiny = keep(Tiny::new(1, 64, &[]));
        let mem = keep(SparseMem::default());
        let cpus = [NodeId::new(0), NodeId::new(0)];
        let m = Arc::new(tiny.boot_with_cpus(mem, &cpus, PcpConfig { batch: 1, high: 2 }));
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
                FreeError::DoubleFree { .. } | FreeError::NotAllocated { .. }
            ),
            "{err:?}"
        );
        m.check_invariants().expect("invariants");
    });
}

/// Two CPUs free the same frame into their own caches at once. Each cache already holds a
/// frame and keeps at most one, so the winner's push overflows its list and drains the frame
/// straight back to the zone (where it may merge) while the loser is still looking at its tag.
/// Exactly one free wins, the loser gets a typed error naming the frame, and afterwards every
/// frame is free exactly once.
#[test]
fn double_free_into_two_caches() {
    model(|| {
        let tiny = keep(Tiny::new(1, 64, &[]));
        let mem = keep(SparseMem::default());
        let n0 = NodeId::new(0);
        let m = Arc::new(tiny.boot_with_cpus(mem, &[n0, n0], PcpConfig { batch: 1, high: 1 }));
        let before = m.node(n0).expect("node 0").free_pages();
        for i in 0..2 {
            let c = m.cpu(i).expect("cpu");
            let x = m
                .alloc_cpu(c, Order::ZERO, AllocFlags::empty())
                .expect("memory");
            m.free_cpu(c, x, Order::ZERO).expect("own frame");
        }
        assert_eq!(m.cached_pages(), 2);
        let p = m
            .alloc(n0, Order::ZERO, AllocFlags::THISNODE)
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
        let mine = m.free_cpu(m.cpu(0).expect("cpu 0"), p, Order::ZERO);
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
        m.drain_all();
        m.check_invariants().expect("invariants");
        assert_eq!(
            m.node(n0).expect("node 0").free_pages(),
            before,
            "every frame is free exactly once"
        );
    });
}
