//! CPU handles: the claim (one atomic; a second claim of a held CPU fails), a remote drain
//! racing the owner's lock-free operations (the drain becomes a request the owner honours at
//! its next operation or when its handle drops), a remote free of the owner's frame racing the
//! owner's own free of it (one compare-and-swap of the frame's state byte each: exactly one
//! wins), and the unchecked free's contract (a frame the owner frees with a plain store, while
//! another CPU frees a different frame of the same pageblock).
//!
//! Each model says what it costs, measured with `LOOM_MAX_PREEMPTIONS=3`.
#![cfg(numaframe_loom)]

use loom::sync::Arc;
use loom::sync::atomic::{AtomicUsize, Ordering};
use numaframe::{AllocFlags, ClaimError, FreeError, NodeId, Order, PcpConfig, Pfn};
use numaframe_loom::{Steps, Tiny, assert_all_free, model, model_up_to, race, spawn};

const N0: NodeId = NodeId::new(0);

/// Two threads claim CPU 0 at once and, if they get it, allocate and free through it: at most
/// one handle lives at any time, a failed claim is `Claimed`, at least one claim wins, and once
/// both are done the CPU can be claimed again. Every interleaving at three preemptions: 98
/// executions.
#[test]
fn one_claim_wins() {
    model(|| {
        let m = Arc::new(Tiny::new(1, 64, &[]).boot_kept_with_cpus(&[N0], PcpConfig::default()));
        let live = Arc::new(AtomicUsize::new(0));
        let wins = Arc::new(AtomicUsize::new(0));
        let attempt = {
            let (m, live, wins) = (m.clone(), live.clone(), wins.clone());
            move || match m.claim_cpu(m.cpu(0).expect("cpu 0")) {
                Ok(mut h) => {
                    // Relaxed: a counter only the claim's exclusion orders.
                    assert_eq!(live.fetch_add(1, Ordering::Relaxed), 0, "one live handle");
                    wins.fetch_add(1, Ordering::Relaxed);
                    let p = h.alloc(Order::ZERO, AllocFlags::empty()).expect("memory");
                    h.free(p, Order::ZERO).expect("own frame");
                    live.fetch_sub(1, Ordering::Relaxed);
                }
                Err(e) => assert_eq!(e, ClaimError::Claimed { cpu: 0 }),
            }
        };
        let other = spawn(attempt.clone());
        attempt();
        other.join().expect("thread");
        assert!(wins.load(Ordering::Relaxed) >= 1, "a claim wins");
        drop(m.claim_cpu(m.cpu(0).expect("cpu 0")).expect("released"));
        assert_all_free(&m);
    });
}

/// The owner claims CPU 0, allocates (its zone lends it the node's pageblock), frees, allocates
/// and frees again, allocates a third time (from the slot the second allocation popped from,
/// with no walk) and drops its handle while another thread drains CPU 0: every frame is in the cache,
/// the zone or the owner's hands, never two of them and never lost.
///
/// Every interleaving at three preemptions: 69 executions, well under a second.
#[test]
fn drain_races_owner() {
    model(|| {
        let m = Arc::new(Tiny::new(1, 64, &[]).boot_kept_with_cpus(&[N0], PcpConfig::default()));
        let before = m.node(N0).expect("node 0").free_pages();
        let c0 = m.cpu(0).expect("cpu 0");
        let ((), q) = race(
            {
                let m = m.clone();
                move || {
                    let mut h = m.claim_cpu(c0).expect("unclaimed");
                    let p = h.alloc(Order::ZERO, AllocFlags::empty()).expect("memory");
                    h.free(p, Order::ZERO).expect("own frame");
                    let q = h.alloc(Order::ZERO, AllocFlags::empty()).expect("memory");
                    h.free(q, Order::ZERO).expect("own frame");
                    // From the slot the last allocation popped from, unless a drain emptied it.
                    let r = h.alloc(Order::ZERO, AllocFlags::empty()).expect("memory");
                    drop(h);
                    r.get()
                }
            },
            || m.drain_cpu(c0),
        );
        let node = m.node(N0).expect("node 0");
        m.check_invariants().expect("invariants");
        assert_eq!(
            node.free_pages() + m.cached_pages() + 1,
            before,
            "every frame but the held one is in a cache or its zone"
        );
        m.free(Pfn::new(q), Order::ZERO).expect("the held frame");
        assert_all_free(&m);
    });
}

/// A drain of a claimed CPU is honoured at the owner's next operation: the owner holds a lent
/// pageblock and one frame of it; once a drain has returned, the owner's free gives the
/// pageblock back before it frees the frame, so every frame is then in the zone. Three
/// preemptions: 16 executions.
#[test]
fn drain_request_is_honoured_at_the_next_operation() {
    model(|| {
        let m = Arc::new(Tiny::new(1, 64, &[]).boot_kept_with_cpus(&[N0], PcpConfig::default()));
        let before = m.node(N0).expect("node 0").free_pages();
        let c0 = m.cpu(0).expect("cpu 0");
        // 1: the owner holds a pageblock; 2: the drain returned.
        let phase = Arc::new(AtomicUsize::new(0));
        let owner = {
            let (m, phase) = (m.clone(), phase.clone());
            spawn(move || {
                let mut h = m.claim_cpu(c0).expect("unclaimed");
                let p = h.alloc(Order::ZERO, AllocFlags::empty()).expect("memory");
                // Release/Acquire: the drain runs after the claim and the lending.
                phase.store(1, Ordering::Release);
                while phase.load(Ordering::Acquire) != 2 {
                    loom::thread::yield_now();
                }
                h.free(p, Order::ZERO).expect("own frame");
                let all = m.node(N0).expect("node 0").free_pages();
                drop(h);
                all
            })
        };
        while phase.load(Ordering::Acquire) != 1 {
            loom::thread::yield_now();
        }
        m.drain_cpu(c0);
        phase.store(2, Ordering::Release);
        let all = owner.join().expect("owner");
        assert_eq!(all, before, "the owner gave its pageblock back first");
        assert_all_free(&m);
    });
}

/// A frame of the pageblock CPU 0 holds is freed twice at once (a caller bug): by the owner
/// through its handle, and by another CPU through the zone lock. Exactly one free wins, the
/// other gets `DoubleFree`, and the state stays consistent.
///
/// Every interleaving at three preemptions: 10 executions.
#[test]
fn remote_free_races_owner_free_of_one_frame() {
    model(|| {
        let m =
            Arc::new(Tiny::new(1, 64, &[]).boot_kept_with_cpus(&[N0, N0], PcpConfig::default()));
        let c0 = m.cpu(0).expect("cpu 0");
        let p = m
            .alloc_cpu(c0, Order::ZERO, AllocFlags::empty())
            .expect("memory");
        let (remote, owner) = race(
            {
                let m = m.clone();
                move || {
                    let mut h = m.claim_cpu(c0).expect("unclaimed");
                    h.free(p, Order::ZERO)
                }
            },
            || m.free_cpu(m.cpu(1).expect("cpu 1"), p, Order::ZERO),
        );
        assert!(
            remote.is_ok() != owner.is_ok(),
            "exactly one free wins: {remote:?} {owner:?}"
        );
        let err = remote.err().or(owner.err()).expect("one error");
        assert_eq!(err, FreeError::DoubleFree { pfn: p });
        assert_all_free(&m);
    });
}

/// The unchecked free's contract: CPU 0 holds the node's one pageblock with every frame handed
/// out. The owner frees one of them, `p`, once, with `free_unchecked`, and allocates twice,
/// while another CPU frees a different frame `q` of the pageblock. The first allocation gets
/// `p` back; the second finds `q` (by the rescan of the remotely freed frames, or after its
/// failing walk made the owner give its pageblock back) or nothing, if `q` was not freed yet;
/// afterwards every frame is free exactly once.
///
/// Two preemptions: 1,234 executions, 7 s on a loaded 2-core machine (three: 9,375
/// executions, 48 s).
#[test]
fn unchecked_free_beside_a_remote_free() {
    model_up_to(2, || {
        let m =
            Arc::new(Tiny::new(1, 64, &[]).boot_kept_with_cpus(&[N0, N0], PcpConfig::default()));
        let c0 = m.cpu(0).expect("cpu 0");
        let all = m.node(N0).expect("node 0").free_pages();
        let held: Vec<Pfn> = (0..all)
            .map(|_| {
                m.alloc_cpu(c0, Order::ZERO, AllocFlags::empty())
                    .expect("memory")
            })
            .collect();
        let (p, q) = (held[0], held[1]);
        let steps = Arc::new(Steps::default());
        let owner = {
            let (m, steps) = (m.clone(), steps.clone());
            spawn(move || {
                let mut h = m.claim_cpu(c0).expect("unclaimed");
                steps.next();
                // SAFETY: `p` was handed out at order 0 and only this thread frees it, once.
                unsafe { h.free_unchecked(p) }.expect("own frame");
                steps.next();
                let first = h.alloc(Order::ZERO, AllocFlags::empty());
                steps.next();
                (first, h.alloc(Order::ZERO, AllocFlags::empty()))
            })
        };
        steps.next();
        m.free_cpu(m.cpu(1).expect("cpu 1"), q, Order::ZERO)
            .expect("CPU 0's frame, freed once");
        let (first, second) = owner.join().expect("owner");
        assert_eq!(first, Some(p), "the frame freed unchecked comes back");
        assert!(second.is_none_or(|r| r == q), "only q was free: {second:?}");
        m.check_invariants().expect("invariants");
        for f in held.iter().filter(|&&f| f != q).chain(second.iter()) {
            m.free(*f, Order::ZERO).expect("a held frame, freed once");
        }
        assert_all_free(&m);
    });
}
