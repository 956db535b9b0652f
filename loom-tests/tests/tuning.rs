//! Retuning the per-CPU caches (`set_pcp`) while a CPU allocates and frees through its cache.
//!
//! `set_pcp` promises to be a barrier: when it returns, every cache follows the new tuning, and
//! with `PcpConfig::OFF` no frame is cached and none will be. Operations read the tuning under
//! their cache lock and `set_pcp` drains every cache after storing it, so an operation either
//! ran before the drain (and the drain undoes what it cached) or sees the new tuning. These
//! models check that promise, and that the tuning is never read torn (a `batch` of one setting
//! with the `high` of the other), in every interleaving.
#![cfg(numaframe_loom)]

use loom::sync::Arc;
use numaframe::{AllocFlags, Machine, NodeId, Order, PcpConfig, Pfn};
use numaframe_loom::{Steps, Tiny, assert_all_free, leave_free, model, spawn};

const N0: NodeId = NodeId::new(0);

fn boot(pcp: PcpConfig) -> Arc<Machine<'static>> {
    Arc::new(Tiny::new(1, 64, &[]).boot_kept_with_cpus(&[N0], pcp))
}

/// CPU 0 allocates (its zone lends it the node's pageblock, which the default tuning keeps
/// until it is wholly free) and frees while caching is turned off. Once `set_pcp(OFF)` returns
/// no cache holds a frame, and none does after the CPU's remaining operations either: the free
/// ends in the zone or was drained.
#[test]
fn turning_caching_off_is_a_barrier() {
    model(|| {
        let m = boot(PcpConfig::default());
        let steps = Arc::new(Steps::default());
        let cpu = {
            let (m, steps) = (m.clone(), steps.clone());
            spawn(move || {
                let c0 = m.cpu(0).expect("cpu 0");
                steps.next();
                let p = m
                    .alloc_cpu(c0, Order::ZERO, AllocFlags::empty())
                    .expect("memory");
                steps.next();
                m.free_cpu(c0, p, Order::ZERO).expect("own frame");
            })
        };
        steps.next();
        m.set_pcp(PcpConfig::OFF);
        assert_eq!(m.cached_pages(), 0, "no frame cached once set_pcp returned");
        cpu.join().expect("cpu");
        assert_eq!(m.cached_pages(), 0, "nor cached afterwards");
        assert_eq!(m.pcp(), PcpConfig::OFF);
        let c0 = m.cpu(0).expect("cpu 0");
        let q = m
            .alloc_cpu(c0, Order::ZERO, AllocFlags::empty())
            .expect("memory");
        m.free_cpu(c0, q, Order::ZERO).expect("own frame");
        assert_eq!(m.cached_pages(), 0, "caching stays off");
        assert_all_free(&m);
    });
}

/// CPU 0 reads the tuning, allocates twice and frees twice while the tuning shrinks from
/// batch 4, high 8 to batch 1, high 1, in a pageblock with six free frames: under the old
/// tuning its frees keep the pageblock, under the new one they give it back. The CPU reads one
/// tuning or the other, never a mix, and at the end its cache holds at most the new `high`:
/// its last free ran before `set_pcp`'s drain (which emptied the cache) or read the new tuning.
/// (There is no such bound while the CPU still allocates: a pageblock lent under the new
/// tuning brings all its free frames, and `high` bounds what frees leave.)
#[test]
fn shrinking_the_tuning_holds_once_set() {
    model(|| {
        let old = PcpConfig { batch: 4, high: 8 };
        let new = PcpConfig { batch: 1, high: 1 };
        let m = boot(old);
        let held = leave_free(&m, N0, 6);
        let cpu = {
            let m = m.clone();
            spawn(move || {
                let seen = m.pcp();
                assert!(seen == old || seen == new, "torn tuning {seen:?}");
                let c0 = m.cpu(0).expect("cpu 0");
                let got: Vec<Pfn> = (0..2)
                    .map(|_| {
                        m.alloc_cpu(c0, Order::ZERO, AllocFlags::empty())
                            .expect("memory")
                    })
                    .collect();
                for &p in &got {
                    m.free_cpu(c0, p, Order::ZERO).expect("own frame");
                }
            })
        };
        m.set_pcp(new);
        cpu.join().expect("cpu");
        assert_eq!(m.pcp(), new);
        assert!(
            m.cached_pages() <= u64::from(new.high),
            "{} cached at the end",
            m.cached_pages()
        );
        for (p, order) in held {
            m.free(p, order).expect("own block");
        }
        assert_all_free(&m);
    });
}
