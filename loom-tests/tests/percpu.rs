//! Per-CPU caches: a CPU's lent pageblock taken back by a remote drain while the CPU allocates
//! and frees in it (and, in a three-way model, while another CPU frees a frame of it too), and
//! double frees racing across CPUs (a plain free against a per-CPU one, and the frame's holder
//! against another CPU while the holder's free gives its pageblock back). A double free is a
//! caller bug the allocator promises to catch: exactly one free may win, or the frame would
//! sit in two places at once and be handed out twice.
#![cfg(numaframe_loom)]

use loom::sync::Arc;
use numaframe::{AllocFlags, FreeError, NodeId, Order, PcpConfig, Pfn};
use numaframe_loom::{Steps, Tiny, assert_all_free, leave_free, model, model_up_to, spawn};

const N0: NodeId = NodeId::new(0);

/// CPU 0 allocates (its zone lends it the node's one pageblock) and frees (the pageblock stays
/// lent: it keeps pageblocks until they are wholly free) while another thread drains CPU 0's
/// cache: every frame ends either in the cache or in the zone, never in both and never lost.
#[test]
fn refill_races_remote_drain() {
    model(|| {
        let m = Arc::new(Tiny::new(1, 64, &[]).boot_kept_with_cpus(&[N0], PcpConfig::default()));
        let before = m.node(N0).expect("node 0").free_pages();
        let c0 = m.cpu(0).expect("cpu 0");
        let worker = {
            let m = m.clone();
            spawn(move || {
                let p = m
                    .alloc_cpu(c0, Order::ZERO, AllocFlags::empty())
                    .expect("memory");
                m.free_cpu(c0, p, Order::ZERO).expect("own frame");
            })
        };
        m.drain_cpu(c0);
        worker.join().expect("worker");
        m.check_invariants().expect("invariants");
        let node = m.node(N0).expect("node 0");
        assert_eq!(
            node.free_pages() + m.cached_pages(),
            before,
            "every frame is in a cache or its zone"
        );
        assert_all_free(&m);
    });
}

/// Two CPUs free the same frame at once (a caller bug), a frame of the pageblock CPU 0 holds:
/// CPU 1 through the zone lock and the frame's state byte, the other thread with a plain free.
/// Exactly one free wins, the other gets a typed error, and the state stays consistent.
#[test]
fn double_free_from_two_cpus() {
    model(|| {
        let m = Arc::new(
            Tiny::new(1, 64, &[]).boot_kept_with_cpus(&[N0, N0], PcpConfig { batch: 1, high: 2 }),
        );
        let c0 = m.cpu(0).expect("cpu 0");
        let p = m
            .alloc_cpu(c0, Order::ZERO, AllocFlags::empty())
            .expect("memory");
        let steps = Arc::new(Steps::default());
        let other = {
            let (m, steps) = (m.clone(), steps.clone());
            spawn(move || {
                steps.next();
                m.free_cpu(m.cpu(1).expect("cpu 1"), p, Order::ZERO)
            })
        };
        steps.next();
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
                FreeError::DoubleFree { pfn } | FreeError::NotAllocated { pfn } if pfn == p
            ),
            "{err:?}"
        );
        assert_all_free(&m);
    });
}

/// CPU 0, which holds the frame's pageblock, and CPU 1 free the same frame at once. The
/// pageblock has three free frames and the tuning keeps at most two, so CPU 0's free, if it
/// wins, gives the pageblock back to the zone (under the zone lock) while CPU 1, which holds
/// nothing, looks the frame up through the zone lock: in a lent pageblock or a returned one.
/// Exactly one free wins, the loser gets a typed error naming the frame, and afterwards every
/// frame is free exactly once.
#[test]
fn double_free_racing_the_holders_give_back() {
    model(|| {
        let m = Arc::new(
            Tiny::new(1, 64, &[]).boot_kept_with_cpus(&[N0, N0], PcpConfig { batch: 1, high: 2 }),
        );
        let held = leave_free(&m, N0, 3);
        let c0 = m.cpu(0).expect("cpu 0");
        let p = m
            .alloc_cpu(c0, Order::ZERO, AllocFlags::empty())
            .expect("memory");
        assert_eq!(m.cached_pages(), 2, "CPU 0 holds the pageblock");
        let steps = Arc::new(Steps::default());
        let other = {
            let (m, steps) = (m.clone(), steps.clone());
            spawn(move || {
                steps.next();
                m.free_cpu(m.cpu(1).expect("cpu 1"), p, Order::ZERO)
            })
        };
        steps.next();
        let mine = m.free_cpu(c0, p, Order::ZERO);
        let theirs = other.join().expect("thread");
        assert!(
            mine.is_ok() != theirs.is_ok(),
            "exactly one free wins: {mine:?} {theirs:?}"
        );
        let err = mine.err().or(theirs.err()).expect("one error");
        assert!(
            matches!(
                err,
                FreeError::DoubleFree { pfn } | FreeError::NotAllocated { pfn } if pfn == p
            ),
            "{err:?}"
        );
        m.check_invariants().expect("invariants");
        for (q, order) in held {
            m.free(q, order).expect("own block");
        }
        assert_all_free(&m);
    });
}

/// What one hand does to CPU 0's lent pageblock in [`lent_pageblock`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hand {
    /// CPU 0 frees one of its frames and takes another: its own stack and state bytes, no
    /// zone lock.
    Owner,
    /// CPU 1 frees a frame of it: through the zone lock, into CPU 0's state array, counted
    /// for CPU 0 to find.
    Remote,
    /// A drain takes it back: CPU 0's cache lock, then the zone lock, building the zone's
    /// planes from the state array.
    Drain,
}

/// CPU 0 holds the node's pageblock, with two frames handed out, and `hands` work on it at
/// once, each on a thread of its own. Every free succeeds wherever the pageblock is by then,
/// CPU 0's allocation gets a frame of the node, and afterwards every frame is free exactly once.
fn lent_pageblock(preemptions: usize, hands: &'static [Hand]) {
    model_up_to(preemptions, move || {
        let m =
            Arc::new(Tiny::new(1, 64, &[]).boot_kept_with_cpus(&[N0, N0], PcpConfig::default()));
        let c0 = m.cpu(0).expect("cpu 0");
        let [p, q] = [0; 2].map(|_| {
            m.alloc_cpu(c0, Order::ZERO, AllocFlags::empty())
                .expect("memory")
        });
        let steps = Arc::new(Steps::default());
        let threads: Vec<_> = hands
            .iter()
            .map(|&hand| {
                let (m, steps) = (m.clone(), steps.clone());
                spawn(move || {
                    steps.next();
                    match hand {
                        Hand::Owner => {
                            m.free_cpu(c0, q, Order::ZERO).expect("own frame");
                            steps.next();
                            let r = m
                                .alloc_cpu(c0, Order::ZERO, AllocFlags::empty())
                                .expect("memory");
                            assert_eq!(m.node_of(r), Some(N0));
                            Some(r)
                        }
                        Hand::Remote => {
                            m.free_cpu(m.cpu(1).expect("cpu 1"), p, Order::ZERO)
                                .expect("CPU 0's frame, freed once");
                            None
                        }
                        Hand::Drain => {
                            m.drain_cpu(c0);
                            None
                        }
                    }
                })
            })
            .collect();
        let mut held: Vec<Pfn> = threads
            .into_iter()
            .filter_map(|t| t.join().expect("thread"))
            .collect();
        // The frames no hand freed.
        if !hands.contains(&Hand::Owner) {
            held.push(q);
        }
        if !hands.contains(&Hand::Remote) {
            held.push(p);
        }
        m.check_invariants().expect("invariants");
        for r in held {
            m.free_cpu(c0, r, Order::ZERO).expect("own frame");
        }
        assert_all_free(&m);
    });
}

#[test]
fn lent_pageblock_owner_and_remote_free() {
    lent_pageblock(3, &[Hand::Owner, Hand::Remote]);
}

#[test]
fn lent_pageblock_remote_free_and_drain() {
    lent_pageblock(3, &[Hand::Remote, Hand::Drain]);
}

#[test]
fn lent_pageblock_owner_and_drain() {
    lent_pageblock(3, &[Hand::Owner, Hand::Drain]);
}

/// All three hands at once, at one preemption (878 executions, 2 s): two ran for more than ten
/// minutes. The models of two hands run at three.
#[test]
fn lent_pageblock_in_three_hands() {
    lent_pageblock(1, &[Hand::Owner, Hand::Remote, Hand::Drain]);
}
