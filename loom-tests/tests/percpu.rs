//! Per-CPU caches: a refill racing a remote drain, and a double free racing across CPUs.
#![cfg(numaframe_loom)]

use loom::sync::Arc;
use numaframe::{AllocFlags, FreeError, NodeId, Order, PcpConfig};
use numaframe_loom::{SparseMem, Tiny};

fn leak<T>(v: T) -> &'static T {
    Box::leak(Box::new(v))
}

/// CPU 0 allocates (refilling its cache) and frees while CPU 1 drains CPU 0's cache: every
/// frame ends either in a cache or in the zone, never in both and never lost.
#[test]
fn refill_races_remote_drain() {
    loom::model(|| {
        let tiny = leak(Tiny::new(1, 64, &[]));
        let mem = leak(SparseMem::default());
        let cpus = [NodeId::new(0), NodeId::new(0)];
        let m = Arc::new(tiny.boot_with_cpus(mem, &cpus, PcpConfig { batch: 2, high: 4 }));
        let node = m.node(NodeId::new(0)).expect("node 0");
        let before = node.free_pages();
        let (c0, c1) = (m.cpu(0).expect("cpu 0"), m.cpu(1).expect("cpu 1"));
        let worker = {
            let m = m.clone();
            loom::thread::spawn(move || {
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
    loom::model(|| {
        let tiny = leak(Tiny::new(1, 64, &[]));
        let mem = leak(SparseMem::default());
        let cpus = [NodeId::new(0), NodeId::new(0)];
        let m = Arc::new(tiny.boot_with_cpus(mem, &cpus, PcpConfig { batch: 1, high: 2 }));
        let c0 = m.cpu(0).expect("cpu 0");
        let p = m
            .alloc_cpu(c0, Order::ZERO, AllocFlags::empty())
            .expect("memory");
        let other = {
            let m = m.clone();
            loom::thread::spawn(move || m.free_cpu(m.cpu(1).expect("cpu 1"), p, Order::ZERO))
        };
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
