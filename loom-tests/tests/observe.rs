//! The observers, `check_invariants` and `numastat`, run while another CPU allocates and frees
//! through its cache and the zones. Tests, fuzzers and monitoring call them on live machines,
//! so they must not report what never happened: `check_invariants` never returns an error
//! for a consistent machine, whatever operation it overlaps, and numastat counters only ever
//! grow while they are read, and add up to the allocations made once the threads are done.
#![cfg(numaframe_loom)]

use loom::sync::Arc;
use numaframe::{AllocFlags, Machine, NodeId, NumaStat, Order, PcpConfig};
use numaframe_loom::{Steps, Tiny, assert_all_free, model_up_to, spawn};

const N0: NodeId = NodeId::new(0);

fn boot() -> Arc<Machine<'static>> {
    Arc::new(Tiny::new(1, 64, &[]).boot_kept_with_cpus(&[N0], PcpConfig { batch: 2, high: 2 }))
}

/// CPU 0 allocates through its cache (a refill) and from the zone, then frees the first
/// frame to the zone and the second into the cache: two allocations, both hits on node 0 by a
/// CPU of node 0.
fn mutate(m: &Machine<'_>, steps: &Steps) {
    let c0 = m.cpu(0).expect("cpu 0");
    steps.next();
    let through_cache = m
        .alloc_cpu(c0, Order::ZERO, AllocFlags::empty())
        .expect("memory");
    steps.next();
    let plain = m
        .alloc(N0, Order::ZERO, AllocFlags::THISNODE)
        .expect("memory");
    steps.next();
    m.free(through_cache, Order::ZERO).expect("own frame");
    steps.next();
    m.free_cpu(c0, plain, Order::ZERO).expect("own frame");
}

/// The counters after `mutate`: two hits, both local.
const AFTER: [u64; 6] = [2, 0, 0, 0, 2, 0];

fn counters(s: &NumaStat) -> [u64; 6] {
    [
        s.numa_hit,
        s.numa_miss,
        s.numa_foreign,
        s.interleave_hit,
        s.local_node,
        s.other_node,
    ]
}

/// At two preemptions (5,952 executions, 18 s): at three the two models of this file took
/// 340 s together.
#[test]
fn check_invariants_during_mutation() {
    model_up_to(2, || {
        let m = boot();
        let steps = Arc::new(Steps::default());
        let cpu = {
            let (m, steps) = (m.clone(), steps.clone());
            spawn(move || mutate(&m, &steps))
        };
        steps.next();
        m.check_invariants().expect("no spurious invariant error");
        cpu.join().expect("cpu");
        assert_all_free(&m);
    });
}

/// numastat read twice while CPU 0 allocates: no counter goes down between the reads or from
/// a read to the final count, and the final counts are the two local hits.
///
/// At two preemptions (8,420 executions, 29 s), as the previous model.
#[test]
fn numastat_during_mutation() {
    model_up_to(2, || {
        let m = boot();
        let steps = Arc::new(Steps::default());
        let cpu = {
            let (m, steps) = (m.clone(), steps.clone());
            spawn(move || mutate(&m, &steps))
        };
        let read = || {
            steps.next();
            counters(&m.numastat(N0).expect("node 0"))
        };
        let (first, second) = (read(), read());
        cpu.join().expect("cpu");
        let last = read();
        assert_eq!(last, AFTER);
        for (i, ((a, b), c)) in first.iter().zip(&second).zip(&last).enumerate() {
            assert!(
                a <= b && b <= c,
                "counter {i} went down: {first:?} {second:?} {last:?}"
            );
        }
        assert_all_free(&m);
    });
}
