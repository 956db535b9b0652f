//! A bulk allocation racing frees on the same zone.
#![cfg(numaframe_loom)]

use loom::sync::Arc;
use numaframe::{AllocFlags, NodeId, Order, Pfn};
use numaframe_loom::{Tiny, model, spawn};

#[test]
fn bulk_alloc_races_frees() {
    model(|| {
        let m = Arc::new(Tiny::new(1, 64, &[]).boot_kept());
        let n0 = NodeId::new(0);
        let before = m.node(n0).expect("node 0").free_pages();
        let held: Vec<Pfn> = (0..2)
            .map(|_| {
                m.alloc(n0, Order::ZERO, AllocFlags::THISNODE)
                    .expect("memory")
            })
            .collect();
        let freer = {
            let m = m.clone();
            spawn(move || m.free_bulk(&held).expect("own frames"))
        };
        let mut out = [Pfn::new(0); 3];
        let got = m.alloc_bulk(n0, AllocFlags::THISNODE, &mut out);
        assert_eq!(got, 3, "plenty of memory");
        freer.join().expect("thread");
        let mut seen = out.to_vec();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), 3, "no frame handed out twice");
        m.check_invariants().expect("invariants");
        assert_eq!(m.node(n0).expect("node 0").free_pages(), before - 3);
    });
}
