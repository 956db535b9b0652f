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

/// A zone exhausted down to its watermark says so without its lock; a free that happens before
/// an allocation (here through a flag) must be seen by it, whichever order the threads run in.
#[test]
fn a_free_seen_through_a_flag_serves_an_allocation_of_an_exhausted_zone() {
    model(|| {
        let m = Arc::new(Tiny::new(1, 96, &[]).boot_kept());
        let node = NodeId::new(0);
        let mut held = Vec::new();
        while let Some(p) = m.alloc(node, Order::ZERO, AllocFlags::THISNODE) {
            held.push(p);
        }
        let last = held.pop().expect("a frame");
        let freed = Arc::new(loom::sync::atomic::AtomicBool::new(false));
        let freer = {
            let (m, freed) = (m.clone(), freed.clone());
            spawn(move || {
                m.free(last, Order::ZERO).expect("own frame");
                freed.store(true, loom::sync::atomic::Ordering::Release);
            })
        };
        let taker = {
            let (m, freed) = (m.clone(), freed.clone());
            spawn(move || {
                if freed.load(loom::sync::atomic::Ordering::Acquire) {
                    let p = m.alloc(node, Order::ZERO, AllocFlags::THISNODE);
                    assert!(p.is_some(), "the free happened before this allocation");
                    p
                } else {
                    None
                }
            })
        };
        freer.join().expect("thread");
        if let Some(p) = taker.join().expect("thread") {
            held.push(p);
        }
        m.free_bulk(&held).expect("own frames");
        m.check_invariants().expect("invariants");
    });
}
