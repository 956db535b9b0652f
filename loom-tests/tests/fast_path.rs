//! The per-CPU fast path (an order-0 `alloc_cpu` popping a frame of the CPU's lent pageblock
//! without reading the layout or taking a zone lock) racing a hot-add that publishes a span on
//! the CPU's own node.
//!
//! The fast path trusts what the hot-add changes under it: "the first zone of the preferred
//! node with memory", which moves from `Dma32` to `Normal` when the hot-add gives the node its
//! first `Normal` span, and the lent pageblock itself, whose frames outside the boot span are
//! the next span's when the hot-add fills the rest of the pageblock. In every interleaving each
//! allocation gets a distinct frame, either a cached one or (once the walk prefers the new
//! zone) one of the new span, and afterwards every frame is free exactly once.
#![cfg(numaframe_loom)]

use loom::sync::Arc;
use numaframe::node::DMA32_END;
use numaframe::zonelist::FallbackOptions;
use numaframe::{AllocFlags, NodeId, Order, PcpConfig, Pfn, PhysRange};
use numaframe_loom::{SparseMem, Steps, Tiny, assert_all_free, keep, model, spawn};

const FRAMES: u64 = 64;

/// CPU 0's cache holds node 0's one pageblock (its boot span is a part of one); one thread
/// takes two frames through the fast path while another hot-adds `added` to node 0.
fn fast_path_races_hot_add(added: PhysRange) {
    model(move || {
        let tiny = keep(Tiny::new(1, FRAMES, &[]));
        let mem = keep(SparseMem::default());
        let n0 = NodeId::new(0);
        let m = Arc::new(tiny.boot_with_cpus(mem, &[n0], PcpConfig::default()));
        let c0 = m.cpu(0).expect("cpu 0");
        // The zone lends CPU 0 the pageblock; the free puts the popped frame back, and the
        // CPU keeps the pageblock until it is wholly free.
        let p = m
            .alloc_cpu(c0, Order::ZERO, AllocFlags::empty())
            .expect("memory");
        m.free_cpu(c0, p, Order::ZERO).expect("own frame");
        let node = m.node(n0).expect("node 0");
        assert_eq!(
            m.cached_pages(),
            node.managed_pages(),
            "every frame is cached"
        );
        let boot = tiny.ranges[0].range;

        let steps = Arc::new(Steps::default());
        let adder = {
            let (m, steps) = (m.clone(), steps.clone());
            spawn(move || {
                steps.next();
                m.hot_add(mem, n0, added, FallbackOptions::default())
                    .expect("hot-add of a free range");
            })
        };
        let got: Vec<Pfn> = (0..2)
            .map(|_| {
                steps.next();
                m.alloc_cpu(c0, Order::ZERO, AllocFlags::empty())
                    .expect("a cached frame or a new one")
            })
            .collect();
        adder.join().expect("adder");

        assert_ne!(got[0], got[1], "one frame handed out twice");
        for &q in &got {
            assert!(
                boot.contains(q) || added.contains(q),
                "{q:?} is neither cached nor new"
            );
            assert_eq!(m.node_of(q), Some(n0));
            m.free_cpu(c0, q, Order::ZERO).expect("own frame");
        }
        assert_all_free(&m);
        let node = m.node(n0).expect("node 0");
        assert!(
            node.managed_pages() > boot.frames(),
            "the hot-added span counts"
        );
    });
}

/// A second span in the zone the cached frames come from, in the pageblock CPU 0 holds.
#[test]
fn fast_path_races_a_span_joining_its_zone() {
    fast_path_races_hot_add(
        PhysRange::new(Pfn::new(FRAMES), Pfn::new(2 * FRAMES)).expect("ordered"),
    );
}

/// The node's first `Normal` span: the zone the fast path starts from changes.
#[test]
fn fast_path_races_the_first_span_of_a_higher_zone() {
    let start = DMA32_END.get();
    fast_path_races_hot_add(
        PhysRange::new(Pfn::new(start), Pfn::new(start + FRAMES)).expect("ordered"),
    );
}
