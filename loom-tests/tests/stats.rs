//! numastat counters from two threads: every allocation is counted exactly once, as a hit
//! and as local, whichever way the threads interleave.
#![cfg(numaframe_loom)]

use loom::sync::Arc;
use numaframe::{AllocFlags, NodeId, Order, PcpConfig};
use numaframe_loom::{Tiny, model, spawn};

#[test]
fn counters_stay_consistent() {
    model(|| {
        let cpus = [NodeId::new(0), NodeId::new(1)];
        let m = Arc::new(
            Tiny::new(2, 64, &[]).boot_kept_with_cpus(&cpus, PcpConfig { batch: 1, high: 1 }),
        );
        let (n0, n1) = (NodeId::new(0), NodeId::new(1));
        let remote = {
            let m = m.clone();
            spawn(move || {
                // CPU 1 allocates through its cache on node 0's behalf: a hit on node 0 and
                // other_node there (the CPU is on node 1), counted by CPU 1.
                let c1 = m.cpu(1).expect("cpu 1");
                let p = m
                    .alloc_from(n1, n0, Order::ZERO, AllocFlags::THISNODE)
                    .expect("memory");
                let q = m
                    .alloc_cpu(c1, Order::ZERO, AllocFlags::empty())
                    .expect("memory");
                (p, q)
            })
        };
        let p = m
            .alloc(n0, Order::ZERO, AllocFlags::empty())
            .expect("memory");
        let (rp, rq) = remote.join().expect("thread");
        let s0 = m.numastat(n0).expect("node 0");
        let s1 = m.numastat(n1).expect("node 1");
        assert_eq!((s0.numa_hit, s0.local_node, s0.other_node), (2, 1, 1));
        assert_eq!((s1.numa_hit, s1.local_node, s1.other_node), (1, 1, 0));
        assert_eq!(
            s0.numa_miss + s0.numa_foreign + s1.numa_miss + s1.numa_foreign,
            0
        );
        for f in [p, rp] {
            m.free(f, Order::ZERO).expect("own frame");
        }
        m.free_cpu(m.cpu(1).expect("cpu 1"), rq, Order::ZERO)
            .expect("own frame");
        m.check_invariants().expect("invariants");
    });
}
