//! All-or-nothing bulk frees racing other frees of a frame they share (a caller's double
//! free): a `free_bulk` claims every frame first and frees only once all claims held, so a
//! plain `free`, a per-CPU `free_cpu` or a second bulk of the same frame must lose cleanly or
//! win cleanly. In every interleaving exactly one of the two calls succeeds, the loser gets a
//! typed error naming the shared frame (a losing bulk also names its index), and the state is
//! as if only the winner had run: the loser's other frames are still allocated (they free
//! afterwards), and every frame is free exactly once at the end.
#![cfg(numaframe_loom)]

use loom::sync::Arc;
use numaframe::{AllocFlags, BulkFreeError, FreeError, Machine, NodeId, Order, PcpConfig, Pfn};
use numaframe_loom::{SparseMem, Steps, Tiny, keep, model, spawn};

const N0: NodeId = NodeId::new(0);

/// A one-node machine with a CPU (caching on) and three order-0 frames allocated.
fn setup() -> (Arc<Machine<'static>>, [Pfn; 3]) {
    let tiny = keep(Tiny::new(1, 64, &[]));
    let mem = keep(SparseMem::default());
    let m = tiny.boot_with_cpus(mem, &[N0], PcpConfig { batch: 1, high: 2 });
    let f = [0; 3].map(|_| {
        m.alloc(N0, Order::ZERO, AllocFlags::THISNODE)
            .expect("memory")
    });
    (Arc::new(m), f)
}

/// The error a losing free of `p` may get: the frame is claimed by a bulk in progress, cached,
/// free, or merged into a free block.
fn lost(err: FreeError, p: Pfn) -> bool {
    matches!(
        err,
        FreeError::DoubleFree { pfn } | FreeError::NotAllocated { pfn } if pfn == p
    )
}

/// Frees what is still held and checks that every frame of node 0 is free exactly once.
fn settle(m: &Machine<'_>, held: &[Pfn]) {
    for &p in held {
        m.free(p, Order::ZERO)
            .expect("still allocated: the loser changed nothing");
    }
    m.drain_all();
    m.check_invariants().expect("invariants");
    let node = m.node(N0).expect("node 0");
    assert_eq!(
        node.free_pages(),
        node.managed_pages(),
        "every frame is back"
    );
}

/// A bulk of `[a, b]` against a free of `b` by `single` (plain or per-CPU).
fn bulk_against_single(single: fn(&Machine<'_>, Pfn) -> Result<(), FreeError>) {
    model(move || {
        let (m, [a, b, c]) = setup();
        let steps = Arc::new(Steps::default());
        let other = {
            let (m, steps) = (m.clone(), steps.clone());
            spawn(move || {
                steps.next();
                single(&m, b)
            })
        };
        steps.next();
        let bulk = m.free_bulk(&[a, b]);
        let single = other.join().expect("thread");
        match (bulk, single) {
            (Ok(()), Err(e)) => {
                assert!(lost(e, b), "{e:?}");
                settle(&m, &[c]);
            }
            (Err(BulkFreeError { index, error }), Ok(())) => {
                assert_eq!(index, 1, "the bulk fails on the shared frame");
                assert!(lost(error, b), "{error:?}");
                settle(&m, &[a, c]);
            }
            other => panic!("exactly one free wins: {other:?}"),
        }
    });
}

#[test]
fn bulk_claim_races_a_plain_free() {
    bulk_against_single(|m, p| m.free(p, Order::ZERO));
}

#[test]
fn bulk_claim_races_a_per_cpu_free() {
    bulk_against_single(|m, p| m.free_cpu(m.cpu(0).expect("cpu 0"), p, Order::ZERO));
}

/// Bulks of `[a, b]` and `[b, c]`: whichever claims `b` first wins, the other rolls back its
/// own claim (of `a`, or of nothing) and reports `b` at its index. Returns the loser's error.
fn two_bulks_share_a_frame(m: &Arc<Machine<'static>>, [a, b, c]: [Pfn; 3]) -> FreeError {
    let steps = Arc::new(Steps::default());
    let other = {
        let (m, steps) = (m.clone(), steps.clone());
        spawn(move || {
            steps.next();
            m.free_bulk(&[b, c])
        })
    };
    steps.next();
    let mine = m.free_bulk(&[a, b]);
    let theirs = other.join().expect("thread");
    let (error, held) = match (mine, theirs) {
        (Ok(()), Err(BulkFreeError { index: 0, error })) => (error, c),
        (Err(BulkFreeError { index: 1, error }), Ok(())) => (error, a),
        other => panic!("exactly one bulk wins, the other fails on b: {other:?}"),
    };
    settle(m, &[held]);
    error
}

/// The state after two bulks sharing a frame: one winner, the loser changed nothing.
#[test]
fn two_bulks_share_a_frame_one_wins() {
    model(|| {
        let (m, f) = setup();
        let error = two_bulks_share_a_frame(&m, f);
        // Which kind of error names `b` is the next model's concern.
        assert!(
            matches!(
                error,
                FreeError::DoubleFree { pfn }
                    | FreeError::NotAllocated { pfn }
                    | FreeError::Duplicate { pfn } if pfn == f[1]
            ),
            "{error:?}"
        );
    });
}

/// The losing bulk of two sharing a frame reports a double free of it, as a losing plain free
/// does: `Duplicate` means the frame appears twice in the loser's own slice, which it does not.
#[test]
#[ignore = "bug: a bulk that finds its frame claimed by another thread's bulk reports \
            Duplicate, which says the frame appears twice in its own slice"]
fn a_bulk_losing_a_shared_frame_reports_a_double_free() {
    model(|| {
        let (m, f) = setup();
        let error = two_bulks_share_a_frame(&m, f);
        assert!(lost(error, f[1]), "{error:?}");
    });
}
