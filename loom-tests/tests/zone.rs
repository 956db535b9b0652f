//! Two threads allocating and freeing on one zone.
#![cfg(numaframe_loom)]

use loom::sync::Arc;
use numaframe::{AllocFlags, NodeId, Order};
use numaframe_loom::{Tiny, model, spawn};

#[test]
fn alloc_free_two_threads_one_zone() {
    model(|| {
        let m = Arc::new(Tiny::new(1, 96, &[]).boot_kept());
        let free_before = m.node(NodeId::new(0)).expect("node 0").free_pages();
        let handles: Vec<_> = (0..2)
            .map(|i| {
                let m = m.clone();
                spawn(move || {
                    let order = Order::new(i);
                    let p = m
                        .alloc(NodeId::new(0), order, AllocFlags::THISNODE)
                        .expect("memory");
                    m.free(p, order).expect("own block");
                    p
                })
            })
            .collect();
        for h in handles {
            h.join().expect("thread");
        }
        m.check_invariants().expect("invariants");
        assert_eq!(
            m.node(NodeId::new(0)).expect("node 0").free_pages(),
            free_before
        );
    });
}
