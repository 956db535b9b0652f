//! Memory hot-add racing an allocation: the allocating thread sees the old fallback list or the
//! new one, never a torn one.
//!
//! Node 0 is exhausted before the threads start and node 1 is memoryless, so the only memory an
//! allocation can find is the range being hot-added to node 1. Under the old lists (node 0: `0`)
//! the allocation fails; under the new ones (node 0: `0 1`) it must succeed, on node 1.
#![cfg(numaframe_loom)]

use loom::sync::Arc;
use numaframe::zonelist::FallbackOptions;
use numaframe::{AllocFlags, MAX_ORDER, NodeId, Order, Pfn, PhysRange};
use numaframe_loom::{SparseMem, Tiny};

const FRAMES: u64 = 64;

fn order_of(m: &numaframe::Machine<'_>, node: usize) -> Vec<usize> {
    let mut row = [NodeId::default(); 2];
    let len = m.fallback_order(NodeId::new(node), &mut row);
    row[..len].iter().map(|n| n.index()).collect()
}

#[test]
fn hot_add_races_an_allocation() {
    loom::model(|| {
        // loom threads need 'static data: the machine's tables and memory are leaked (a few KiB).
        let tiny: &'static Tiny = Box::leak(Box::new(Tiny::new(2, FRAMES, &[1])));
        let mem: &'static SparseMem = Box::leak(Box::new(SparseMem::default()));
        let m = Arc::new(tiny.boot(mem));
        let (n0, n1) = (NodeId::new(0), NodeId::new(1));

        // Exhaust node 0 with few allocations: the largest blocks first.
        let mut held: Vec<(Pfn, Order)> = Vec::new();
        for k in (0..=MAX_ORDER).rev() {
            let order = Order::new(k);
            while let Some(p) = m.alloc(n0, order, AllocFlags::THISNODE) {
                held.push((p, order));
            }
        }
        assert_eq!(m.node(n0).expect("node 0").free_pages(), 0);
        assert_eq!(order_of(&m, 0), [0]);
        assert_eq!(order_of(&m, 1), [0]);

        let adder = {
            let m = m.clone();
            loom::thread::spawn(move || {
                // Node 1's slot in Tiny's layout, left empty at boot.
                let range =
                    PhysRange::new(Pfn::new(FRAMES), Pfn::new(2 * FRAMES)).expect("ordered");
                m.hot_add(mem, n1, range, FallbackOptions::default())
                    .expect("hot-add");
            })
        };
        let allocator = {
            let m = m.clone();
            loom::thread::spawn(move || {
                let seen = order_of(&m, 0);
                assert!(seen == [0] || seen == [0, 1], "torn list {seen:?}");
                match m.alloc(n0, Order::ZERO, AllocFlags::empty()) {
                    // The old list: node 0 only, and it is empty.
                    None => {}
                    // The new list: the only free memory is the hot-added range on node 1.
                    Some(p) => {
                        assert_eq!(m.node_of(p), Some(n1), "frame {p:?} from the wrong node");
                        m.free(p, Order::ZERO).expect("own frame");
                    }
                }
                if seen == [0, 1] {
                    // Lists only ever grow here: once the new list is seen, it stays.
                    assert_eq!(order_of(&m, 0), [0, 1]);
                }
            })
        };
        adder.join().expect("adder");
        allocator.join().expect("allocator");

        m.check_invariants().expect("invariants");
        assert_eq!(order_of(&m, 0), [0, 1]);
        assert_eq!(order_of(&m, 1), [1, 0]);
        let node1 = m.node(n1).expect("node 1");
        assert!(node1.managed_pages() > 0);
        assert_eq!(
            node1.free_pages(),
            node1.managed_pages(),
            "the frame came back"
        );
        for (p, order) in held {
            m.free(p, order).expect("own block");
        }
        m.check_invariants().expect("invariants");
    });
}
