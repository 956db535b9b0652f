//! CPU handles: the claim (one atomic; a second claim of a held CPU fails), a remote drain
//! racing the owner's lock-free operations (the drain becomes a request the owner honours at
//! its next operation or when its handle drops), a remote free of the owner's frame racing the
//! owner's own free of it (one compare-and-swap of the frame's state byte each: exactly one
//! wins), and the unchecked free's contract (a frame the owner frees with a plain store, while
//! another CPU frees a different frame of the same pageblock). Then the handle's bulks: a bulk
//! free (under its frames' zone lock) racing a remote free of one of its frames (all or
//! nothing, one winner), a bulk
//! allocation's run beside a remote free, and a new tuning racing a claim (the handle keeps
//! the tuning's `high` and reads it again when it claims or honours a request). Last, a
//! handle's drop and an honoured drain racing remote frees, a claim racing the locked API of
//! its CPU, and numastat, `cached_pages` and the invariant check read while a CPU is claimed.
//! The kicks of a claimed CPU: one per request posted while none waited and its cache held a
//! pageblock, against its polls and against the refill that lends its empty cache one; and a
//! claim racing the drop of a handle with a request to honour.
//! The owner's free on its hot path (a frame of the hot slot) has models of its own against a
//! remote free, a remote bulk free and a refused remote bulk.
//!
//! Each model says what it costs, measured with `LOOM_MAX_PREEMPTIONS=3`.
#![cfg(numaframe_loom)]

use loom::sync::Arc;
use loom::sync::atomic::{AtomicUsize, Ordering};
use numaframe::{AllocFlags, BulkFreeError, ClaimError, FreeError, NodeId, Order, PcpConfig, Pfn};
use numaframe_loom::{Steps, Tiny, assert_all_free, model, model_up_to, race, spawn};

const N0: NodeId = NodeId::new(0);

/// One node of 64 frames with CPUs 0 and 1 on it, its boot memory kept for the model.
fn two_cpus() -> Arc<numaframe::Machine<'static>> {
    Arc::new(Tiny::new(1, 64, &[]).boot_kept_with_cpus(&[N0, N0], PcpConfig::default()))
}

/// Two threads claim CPU 0 at once and, if they get it, allocate and free through it: at most
/// one handle lives at any time, a failed claim is `Claimed`, at least one claim wins, and once
/// both are done the CPU can be claimed again. Every interleaving at three preemptions: 133
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
/// with no walk) and drops its handle while another thread drains CPU 0: every frame is in the
/// cache, the zone or the owner's hands, never two of them and never lost.
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
        let m = two_cpus();
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

/// CPU 0's cache holds frame `p` on top of its stack and `q` handed out: the owner's claim then
/// allocates `p` through the walk (which makes the slot hot) and frees it on the hot path.
fn hot_frame(m: &numaframe::Machine<'_>) -> (Pfn, Pfn) {
    let c0 = m.cpu(0).expect("cpu 0");
    let take = || {
        m.alloc_cpu(c0, Order::ZERO, AllocFlags::empty())
            .expect("memory")
    };
    let (q, p) = (take(), take());
    m.free_cpu(c0, p, Order::ZERO).expect("p, freed once");
    (p, q)
}

/// The owner's own frame, allocated and freed again through the hot slot, as
/// [`remote_free_races_owner_free_of_one_frame`] but on the hot free's compare-and-swap.
fn owner_takes_and_frees(
    m: &Arc<numaframe::Machine<'static>>,
) -> impl FnOnce() -> (Option<Pfn>, Result<(), FreeError>) + Send + 'static {
    let m = m.clone();
    move || {
        let c0 = m.cpu(0).expect("cpu 0");
        let mut h = m.claim_cpu(c0).expect("unclaimed");
        let got = h.alloc(Order::ZERO, AllocFlags::empty());
        let freed = got.map_or(Ok(()), |f| h.free(f, Order::ZERO));
        (got, freed)
    }
}

/// The owner's free on its hot path races another CPU's free of the same frame (a caller bug):
/// exactly one wins, the other gets `DoubleFree`. Every interleaving at three preemptions, in
/// well under a second (as the next two).
#[test]
fn the_owners_hot_free_races_a_remote_free_of_one_frame() {
    model(|| {
        let m = two_cpus();
        let (p, q) = hot_frame(&m);
        let (remote, (got, owner)) = race(owner_takes_and_frees(&m), || {
            m.free_cpu(m.cpu(1).expect("cpu 1"), p, Order::ZERO)
        });
        assert_eq!(got, Some(p), "the frame on top of the stack");
        assert!(
            remote.is_ok() != owner.is_ok(),
            "exactly one free wins: {remote:?} {owner:?}"
        );
        m.free(q, Order::ZERO).expect("q, freed once");
        assert_all_free(&m);
    });
}

/// The owner's hot free races another CPU's bulk free of the same frame and a held one: the
/// bulk claims its frames under their zone lock, so exactly one call frees `p`, and a refused
/// bulk leaves `q` handed out. Every interleaving at three preemptions.
#[test]
fn the_owners_hot_free_races_a_remote_bulk_free_of_one_frame() {
    model(|| {
        let m = two_cpus();
        let (p, q) = hot_frame(&m);
        let (remote, (got, owner)) = race(owner_takes_and_frees(&m), || m.free_bulk(&[p, q]));
        assert_eq!(got, Some(p), "the frame on top of the stack");
        assert!(
            remote.is_ok() != owner.is_ok(),
            "exactly one free of p wins: {remote:?} {owner:?}"
        );
        if remote.is_err() {
            m.free(q, Order::ZERO).expect("q stayed handed out");
        }
        assert_all_free(&m);
    });
}

/// The owner's hot free beside another CPU's bulk that is refused (`q` twice) after it claimed
/// `p`: the bulk holds `p` claimed for a moment and gives it back, so the owner's free, which
/// waits for the claim, wins, and the bulk frees nothing. Every interleaving at three
/// preemptions.
#[test]
fn the_owners_hot_free_beside_a_refused_remote_bulk() {
    model(|| {
        let m = two_cpus();
        let (p, q) = hot_frame(&m);
        let (remote, (got, owner)) = race(owner_takes_and_frees(&m), || m.free_bulk(&[q, p, q]));
        assert_eq!(got, Some(p), "the frame on top of the stack");
        assert!(remote.is_err(), "q twice: {remote:?}");
        assert_eq!(owner, Ok(()), "the bulk freed nothing");
        m.free(q, Order::ZERO).expect("q stayed handed out");
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
/// Two preemptions: 1,254 executions, 5 s on a loaded 2-core machine (three: 9,518
/// executions, 39 s).
#[test]
fn unchecked_free_beside_a_remote_free() {
    model_up_to(2, || {
        let m = two_cpus();
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

/// A handle's bulk free of two of its own frames, `p` then `q`, races another CPU's free of `q`
/// (a caller bug). The bulk holds the frames' zone lock, which the remote free takes too, and
/// frees with plain stores: exactly one call frees `q`. Either the bulk wins and the remote
/// free gets `DoubleFree`, or the remote free wins and the bulk is refused at index 1 with `p`
/// put back to handed out (it frees once afterwards).
///
/// Every interleaving at three preemptions: 46 executions.
#[test]
fn bulk_free_races_remote_free_of_one_frame() {
    model(|| {
        let m = two_cpus();
        let c0 = m.cpu(0).expect("cpu 0");
        let take = || {
            m.alloc_cpu(c0, Order::ZERO, AllocFlags::empty())
                .expect("memory")
        };
        let (p, q) = (take(), take());
        let (remote, bulk) = race(
            {
                let m = m.clone();
                move || {
                    let mut h = m.claim_cpu(c0).expect("unclaimed");
                    h.free_bulk(&[p, q])
                }
            },
            || m.free_cpu(m.cpu(1).expect("cpu 1"), q, Order::ZERO),
        );
        match (remote, bulk) {
            (Ok(()), Err(e)) => {
                assert_eq!(
                    e,
                    BulkFreeError {
                        index: 1,
                        error: FreeError::DoubleFree { pfn: q }
                    }
                );
                m.free(p, Order::ZERO).expect("p stayed handed out");
            }
            (Err(e), Ok(())) => assert_eq!(e, FreeError::DoubleFree { pfn: q }),
            other => panic!("exactly one free of q wins: {other:?}"),
        }
        assert_all_free(&m);
    });
}

/// A handle's bulk allocation takes a run of its hot pageblock's frames (a load and a plain
/// store of each byte) while another CPU frees a frame `q` of that pageblock: the run and a
/// later allocation never hand out a frame that is still held, and `q` comes back at most once.
/// CPU 0 holds the node's one pageblock with every frame handed out; the owner frees `p` and
/// allocates it again (which makes the slot hot), frees `p` and `r` in one bulk, allocates two
/// frames in one bulk (a run of `p` and `r`), then allocates once more (`q`, or nothing if `q`
/// was not freed yet).
///
/// Two preemptions: 1,250 executions, 5 s on a loaded 2-core machine (three: 9,456
/// executions, 32 s).
#[test]
fn alloc_bulk_beside_a_remote_free() {
    model_up_to(2, || {
        let m = two_cpus();
        let c0 = m.cpu(0).expect("cpu 0");
        let all = m.node(N0).expect("node 0").free_pages();
        let held: Vec<Pfn> = (0..all)
            .map(|_| {
                m.alloc_cpu(c0, Order::ZERO, AllocFlags::empty())
                    .expect("memory")
            })
            .collect();
        let (p, q, r) = (held[0], held[1], held[2]);
        let steps = Arc::new(Steps::default());
        let owner = {
            let (m, steps) = (m.clone(), steps.clone());
            spawn(move || {
                let mut h = m.claim_cpu(c0).expect("unclaimed");
                // The first allocation walks and makes the pageblock's slot hot.
                h.free(p, Order::ZERO).expect("own frame");
                let first = h.alloc(Order::ZERO, AllocFlags::empty());
                h.free_bulk(&[p, r]).expect("own frames");
                steps.next();
                let mut run = [Pfn::new(0); 2];
                let got = h.alloc_bulk(AllocFlags::empty(), &mut run);
                steps.next();
                (first, got, run, h.alloc(Order::ZERO, AllocFlags::empty()))
            })
        };
        steps.next();
        m.free_cpu(m.cpu(1).expect("cpu 1"), q, Order::ZERO)
            .expect("CPU 0's frame, freed once");
        let (first, got, run, last) = owner.join().expect("owner");
        assert_eq!(first, Some(p), "LIFO");
        assert_eq!(got, 2);
        let mut sorted = run;
        sorted.sort();
        let mut want = [p, r];
        want.sort();
        assert_eq!(sorted, want, "the run is the two frames freed");
        assert!(last.is_none_or(|l| l == q), "only q was free: {last:?}");
        m.check_invariants().expect("invariants");
        for f in held.iter().filter(|&&f| f != q).chain(last.iter()) {
            m.free(*f, Order::ZERO).expect("a held frame, freed once");
        }
        assert_all_free(&m);
    });
}

/// A new tuning races a claim: `set_pcp` with at most one free frame per pageblock, while
/// another thread claims CPU 0. Once both are done, the handle follows the new tuning: it
/// allocates a frame (its zone lends it the pageblock) and frees it, and that free leaves two
/// free frames, more than `high`, so the pageblock goes back. The handle read the tuning when it
/// claimed the cache after the drain, or honours the drain's request before its allocation.
///
/// Every interleaving at three preemptions: 212 executions.
#[test]
fn a_new_tuning_reaches_a_claim_it_races() {
    model(|| {
        let m = Arc::new(Tiny::new(1, 64, &[]).boot_kept_with_cpus(&[N0], PcpConfig::default()));
        let before = m.node(N0).expect("node 0").free_pages();
        let c0 = m.cpu(0).expect("cpu 0");
        // 1: the claim returned; 2: `set_pcp` returned.
        let phase = Arc::new(AtomicUsize::new(0));
        let owner = {
            let (m, phase) = (m.clone(), phase.clone());
            spawn(move || {
                let mut h = m.claim_cpu(c0).expect("unclaimed");
                // Release/Acquire: the main thread waits for the claim before it says
                // `set_pcp` returned.
                phase.store(1, Ordering::Release);
                while phase.load(Ordering::Acquire) != 2 {
                    loom::thread::yield_now();
                }
                let p = h.alloc(Order::ZERO, AllocFlags::empty()).expect("memory");
                let held = m.node(N0).expect("node 0").free_pages();
                h.free(p, Order::ZERO).expect("own frame");
                let after = m.node(N0).expect("node 0").free_pages();
                drop(h);
                (held, after)
            })
        };
        m.set_pcp(PcpConfig { batch: 1, high: 1 });
        while phase.load(Ordering::Acquire) != 1 {
            loom::thread::yield_now();
        }
        phase.store(2, Ordering::Release);
        let (held, after) = owner.join().expect("owner");
        assert!(held < before - 1, "the allocation was lent a pageblock");
        assert_eq!(after, before, "the free gave the pageblock back");
        assert_all_free(&m);
    });
}

/// A handle's drop races a remote free of one of its frames and a drain of its CPU. CPU 0 holds
/// the node's pageblock with two frames handed out, `p` and `q`; its owner claims it, frees `q`
/// through the handle and drops it (honouring a drain request if one was posted meanwhile)
/// while another CPU frees `p` (into the lent pageblock, or into the zone once it was given
/// back) and a third thread drains CPU 0 (posting a request, or taking the cache lock once the
/// claim is gone). Afterwards every frame is free exactly once.
///
/// One preemption, well under a second; at two, some executions of the three threads run past
/// `LOOM_MAX_BRANCHES=10000`.
#[test]
fn handle_drop_races_a_remote_free_and_a_drain() {
    model_up_to(1, || {
        let m = two_cpus();
        let c0 = m.cpu(0).expect("cpu 0");
        let [p, q] = [0; 2].map(|_| {
            m.alloc_cpu(c0, Order::ZERO, AllocFlags::empty())
                .expect("memory")
        });
        let steps = Arc::new(Steps::default());
        let owner = {
            let (m, steps) = (m.clone(), steps.clone());
            spawn(move || {
                let mut h = m.claim_cpu(c0).expect("unclaimed");
                steps.next();
                h.free(q, Order::ZERO).expect("own frame");
                drop(h);
            })
        };
        let remote = {
            let (m, steps) = (m.clone(), steps.clone());
            spawn(move || {
                steps.next();
                m.free_cpu(m.cpu(1).expect("cpu 1"), p, Order::ZERO)
                    .expect("CPU 0's frame, freed once");
            })
        };
        steps.next();
        m.drain_cpu(c0);
        owner.join().expect("owner");
        remote.join().expect("remote");
        m.check_invariants().expect("invariants");
        assert_all_free(&m);
    });
}

/// A drain request honoured by the owner's next operation (its pageblock goes back to the zone
/// from the handle) races another CPU's free of a frame of that pageblock. The owner holds `p`
/// and `q`; once a drain of CPU 0 may have been posted, it frees `q` and allocates `r`, while
/// CPU 1 frees `p`. Both frees succeed, and afterwards (with `r` freed) every frame is free
/// exactly once. Two preemptions: under a second.
#[test]
fn an_honoured_drain_races_a_remote_free() {
    model_up_to(2, || {
        let m = two_cpus();
        let c0 = m.cpu(0).expect("cpu 0");
        let [p, q] = [0; 2].map(|_| {
            m.alloc_cpu(c0, Order::ZERO, AllocFlags::empty())
                .expect("memory")
        });
        let h = m.claim_cpu(c0).expect("unclaimed");
        m.drain_cpu(c0);
        let steps = Arc::new(Steps::default());
        let remote = {
            let (m, steps) = (m.clone(), steps.clone());
            spawn(move || {
                steps.next();
                m.free_cpu(m.cpu(1).expect("cpu 1"), p, Order::ZERO)
                    .expect("CPU 0's frame, freed once");
            })
        };
        let mut h = h;
        steps.next();
        h.free(q, Order::ZERO).expect("own frame");
        let r = h.alloc(Order::ZERO, AllocFlags::empty()).expect("memory");
        drop(h);
        remote.join().expect("remote");
        m.check_invariants().expect("invariants");
        m.free(r, Order::ZERO).expect("the frame the owner holds");
        assert_all_free(&m);
    });
}

/// A claim races an allocation through the locked API of the same CPU (which may lend the
/// CPU a pageblock just before the claim takes the cache) and that caller's free of the frame
/// through another CPU, while the owner allocates and frees through its handle. The locked
/// allocation may find nothing (the node's one pageblock is lent to the busy handle, the
/// documented exception); otherwise every frame is handed out once, and afterwards every frame
/// is free exactly once. Two preemptions: under a second.
#[test]
fn a_claim_races_the_locked_api_of_its_cpu() {
    model_up_to(2, || {
        let m = two_cpus();
        let c0 = m.cpu(0).expect("cpu 0");
        let (mine, theirs) = race(
            {
                let m = m.clone();
                move || {
                    let p = m.alloc_cpu(c0, Order::ZERO, AllocFlags::empty())?;
                    m.free_cpu(m.cpu(1).expect("cpu 1"), p, Order::ZERO)
                        .expect("own frame, freed once");
                    Some(p)
                }
            },
            || {
                let mut h = m.claim_cpu(c0).expect("unclaimed");
                let a = h.alloc(Order::ZERO, AllocFlags::empty()).expect("memory");
                let b = h.alloc(Order::ZERO, AllocFlags::empty()).expect("memory");
                assert_ne!(a, b, "two frames held at once");
                h.free(a, Order::ZERO).expect("own frame");
                (b, h)
            },
        );
        let (b, h) = mine;
        let _ = theirs;
        drop(h);
        m.check_invariants().expect("invariants");
        m.free(b, Order::ZERO).expect("held frame");
        assert_all_free(&m);
    });
}

/// numastat, `cached_pages` and the invariant check read while a handle allocates and frees
/// and drops: the check finds nothing wrong, numastat never goes down, and once the handle
/// dropped numastat counts each of its allocations once (those of its hot path arrive with
/// the drop) and every frame is in the zone, the cache or the caller's hands. Two
/// preemptions: 4 s on a loaded 2-core machine.
#[test]
fn observers_of_a_claimed_cpu() {
    model_up_to(2, || {
        let m = Arc::new(Tiny::new(1, 64, &[]).boot_kept_with_cpus(&[N0], PcpConfig::default()));
        let c0 = m.cpu(0).expect("cpu 0");
        let before = m.node(N0).expect("node 0").free_pages();
        let counted = |m: &numaframe::Machine<'_>| {
            let s = m.numastat(N0).expect("node 0");
            s.numa_hit + s.numa_miss
        };
        let (held, ()) = race(
            {
                let m = m.clone();
                move || {
                    let first = counted(&m);
                    m.check_invariants().expect("invariants");
                    assert!(m.cached_pages() <= before);
                    let second = counted(&m);
                    assert!(second >= first, "numastat went down: {first} -> {second}");
                    assert!(second <= 2, "two allocations at most: {second}");
                }
            },
            || {
                let mut h = m.claim_cpu(c0).expect("unclaimed");
                // The walk (the zone lends the pageblock), then the hot path.
                let p = h.alloc(Order::ZERO, AllocFlags::empty()).expect("memory");
                let q = h.alloc(Order::ZERO, AllocFlags::empty()).expect("memory");
                h.free(p, Order::ZERO).expect("own frame");
                drop(h);
                q
            },
        );
        assert_eq!(counted(&m), 2, "every allocation counted once");
        m.check_invariants().expect("invariants");
        assert_eq!(
            m.node(N0).expect("node 0").free_pages() + m.cached_pages() + 1,
            before,
            "every frame but the held one is in the cache or its zone"
        );
        m.free(held, Order::ZERO).expect("the held frame");
        assert_all_free(&m);
    });
}

/// Counts the kicks of a machine.
#[derive(Default)]
struct Kicks(AtomicUsize);

impl numaframe::CpuKick for Kicks {
    fn kick(&self, _: numaframe::CpuId) {
        // Relaxed: a count read after the threads are joined.
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// One node of 64 frames with CPU 0 on it, its boot memory kept for the model, and the kicks
/// of its CPU counted.
fn kicked_cpu() -> (Arc<numaframe::Machine<'static>>, &'static Kicks) {
    let kicks = numaframe_loom::keep(Kicks::default());
    let m = Tiny::new(1, 64, &[])
        .boot_kept_with_cpus(&[N0], PcpConfig::default())
        .with_kick(kicks);
    (Arc::new(m), kicks)
}

/// Two remote drains of a claimed CPU race its owner's poll: a request kicks the CPU only when
/// none was waiting and its cache may hold a pageblock. The first drain finds both and kicks.
/// The second finds its request waiting (no kick), or the cache emptied by the poll (no kick:
/// the request waits for the next poll), or the poll between clearing the request and
/// publishing the empty cache (a kick, for a request the next poll honours): never more kicks
/// than polls that honoured a request, and once the owner polls again after both the cache is
/// empty. Every interleaving at three preemptions: 106 executions, well under a second.
#[test]
fn every_drain_request_to_a_claimed_cpu_holding_a_pageblock_is_kicked_once() {
    model(|| {
        let (m, kicks) = kicked_cpu();
        let c0 = m.cpu(0).expect("cpu 0");
        let before = m.node(N0).expect("node 0").free_pages();
        let mut h = m.claim_cpu(c0).expect("unclaimed");
        let p = h.alloc(Order::ZERO, AllocFlags::empty()).expect("memory");
        h.free(p, Order::ZERO).expect("own frame");
        let (polled, ()) = race(
            {
                let m = m.clone();
                move || m.drain_cpu(c0)
            },
            || {
                m.drain_cpu(c0);
                h.poll()
            },
        );
        let again = h.poll();
        // Relaxed: a count read after the threads are joined.
        let kicked = kicks.0.load(Ordering::Relaxed);
        let honoured = usize::from(polled) + usize::from(again);
        assert!(
            (1..=honoured).contains(&kicked),
            "{kicked} kicks for {honoured} requests honoured"
        );
        assert_eq!(h.cached_pages(), 0);
        assert_eq!(m.node(N0).expect("node 0").free_pages(), before);
        drop(h);
        assert_all_free(&m);
    });
}

/// A remote drain races the drop of CPU 0's handle: it may find the claim, then post its
/// request after the handle is gone (and drain the cache itself). The locked API then lends
/// the cache a pageblock, and the CPU claimed again and idle is still woken by the next
/// request posted to it: a request bit left behind by a drain of the unclaimed cache must not
/// pass for one its new owner has been kicked for. Every interleaving at three preemptions:
/// well under a second.
#[test]
fn a_request_posted_after_a_handle_dropped_leaves_the_next_claim_kickable() {
    model(|| {
        let (m, kicks) = kicked_cpu();
        let c0 = m.cpu(0).expect("cpu 0");
        let h = m.claim_cpu(c0).expect("unclaimed");
        race(
            {
                let m = m.clone();
                move || m.drain_cpu(c0)
            },
            || drop(h),
        );
        // Relaxed: a count read after the threads are joined.
        let before = kicks.0.load(Ordering::Relaxed);
        let p = m
            .alloc_cpu(c0, Order::ZERO, AllocFlags::empty())
            .expect("memory");
        m.free_cpu(c0, p, Order::ZERO).expect("own frame");
        let mut h = m.claim_cpu(c0).expect("released");
        assert!(h.cached_pages() > 0, "the claim finds the pageblock");
        m.drain_cpu(c0);
        assert_eq!(
            kicks.0.load(Ordering::Relaxed),
            before + 1,
            "the request posted to the idle claimed CPU wakes it"
        );
        assert!(h.poll());
        drop(h);
        assert_all_free(&m);
    });
}

/// A remote drain races the owner's first allocation, which lends its empty cache a
/// pageblock: the drain may post its request before the owner publishes that it holds one (no
/// kick: the owner finds the request in the honour that ends its walk) or after (a kick). In
/// no interleaving does the owner end up idle with frames cached, a request waiting and no
/// kick sent. Every interleaving at three preemptions: 54 executions, well under a second.
#[test]
fn a_drain_racing_the_owners_refill_kicks_it_or_is_honoured_by_it() {
    model(|| {
        let (m, kicks) = kicked_cpu();
        let c0 = m.cpu(0).expect("cpu 0");
        let before = m.node(N0).expect("node 0").free_pages();
        let mut h = m.claim_cpu(c0).expect("unclaimed");
        let (p, _) = race(
            {
                let m = m.clone();
                move || m.drain_cpu(c0)
            },
            || h.alloc(Order::ZERO, AllocFlags::empty()).expect("memory"),
        );
        let cached = h.cached_pages();
        // Relaxed: a count read after the threads are joined.
        let kicked = kicks.0.load(Ordering::Relaxed);
        let waiting = h.poll();
        assert!(kicked <= 1, "one request, {kicked} kicks");
        assert!(
            !(waiting && cached > 0 && kicked == 0),
            "{cached} frames stranded behind a request nobody was woken for"
        );
        h.free(p, Order::ZERO).expect("own frame");
        drop(h);
        m.drain_all();
        assert_eq!(m.node(N0).expect("node 0").free_pages(), before);
        assert_all_free(&m);
    });
}

/// A drain request posted to a claimed CPU is honoured when its handle drops, even when a new
/// claim of the CPU races that drop: CPU 0's owner holds a lent pageblock (a frame allocated
/// and freed) and a drain of CPU 0 has posted its request; the owner drops its handle while
/// another thread claims CPU 0. Whichever wins, the request is honoured by the drop: the new
/// handle (if its claim won) finds an empty cache, and once both are gone no cache holds a
/// frame. Every interleaving at three preemptions: well under a second.
#[test]
fn a_claim_racing_a_drop_leaves_the_dropped_handles_request_honoured() {
    model(|| {
        let m = Arc::new(Tiny::new(1, 64, &[]).boot_kept_with_cpus(&[N0], PcpConfig::default()));
        let c0 = m.cpu(0).expect("cpu 0");
        let mut h = m.claim_cpu(c0).expect("unclaimed");
        let p = h.alloc(Order::ZERO, AllocFlags::empty()).expect("memory");
        h.free(p, Order::ZERO).expect("own frame");
        assert!(h.cached_pages() > 0, "the handle holds a lent pageblock");
        m.drain_cpu(c0);
        let ((), claimed) = race(
            {
                let m = m.clone();
                move || m.claim_cpu(c0).ok().map(|h| h.cached_pages())
            },
            || drop(h),
        );
        assert!(
            claimed.is_none_or(|held| held == 0),
            "the new claim found the pageblock the request asked for: {claimed:?}"
        );
        assert_eq!(m.cached_pages(), 0, "the request was honoured");
        assert_all_free(&m);
    });
}
