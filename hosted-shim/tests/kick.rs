//! A thread that idles with a claimed CPU handle gives its cached frames back when another
//! thread's failing allocation kicks it ([`ThreadKick`]), and that allocation then succeeds.

use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use numaframe::{AllocFlags, NodeId, Order, Pfn};
use numaframe_hosted::bench::numa::{CPUS, OneNode, managed};
use numaframe_hosted::kick::ThreadKick;

#[test]
fn an_idle_owner_woken_by_a_kick_hands_its_cached_frames_to_a_failing_allocation() {
    let node = OneNode::new(4096).unwrap();
    let kick = ThreadKick::new(CPUS);
    let m = node.boot().unwrap().with_kick(&kick);
    let all = managed(&m);
    let c1 = m.cpu(1).unwrap();
    let (ready, stop, polls) = (Barrier::new(2), AtomicBool::new(false), AtomicU64::new(0));
    let taken: Vec<Pfn> = std::thread::scope(|s| {
        s.spawn(|| {
            assert!(kick.register(c1));
            let mut h = m.claim_cpu(c1).unwrap();
            let p = h.alloc(Order::ZERO, AllocFlags::empty()).unwrap();
            h.free(p, Order::ZERO).unwrap();
            assert!(h.cached_pages() > 0);
            ready.wait();
            // Idle: no allocation or free, only the kicks' polls.
            while !stop.load(Ordering::Relaxed) {
                if kick.wait(c1, Duration::from_millis(10)) && h.poll() {
                    polls.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        ready.wait();
        let mut taken = Vec::new();
        // The first failing walk kicks CPU 1; its frames come back once it has polled.
        let deadline = Instant::now() + Duration::from_secs(60);
        while (taken.len() as u64) < all && Instant::now() < deadline {
            match m.alloc(NodeId::new(0), Order::ZERO, AllocFlags::empty()) {
                Some(p) => taken.push(p),
                None => std::thread::sleep(Duration::from_millis(1)),
            }
        }
        stop.store(true, Ordering::Relaxed);
        taken
    });
    assert_eq!(taken.len() as u64, all, "every frame, the idle cache's too");
    assert!(polls.load(Ordering::Relaxed) >= 1);
    m.free_bulk(&taken).unwrap();
    m.check_invariants().unwrap();
}
