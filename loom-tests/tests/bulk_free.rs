//! All-or-nothing bulk frees racing other frees of a frame they share (a caller's double
//! free): a `free_bulk` claims every frame first and frees only once all claims held, so a
//! plain `free`, a per-CPU `free_cpu` or a second bulk of the same frame must lose cleanly or
//! win cleanly. Each race runs twice: with frames the zone handed out (the bulk frees them in
//! the zone's planes, under the zone lock every other free also takes), and with frames of a
//! pageblock lent to CPU 0 (the bulk claims their state bytes, which CPU 0's own free swaps
//! without the zone lock, and which its free may then hand back to the zone). In every
//! interleaving exactly one of the two calls succeeds, the loser gets a typed error naming the
//! shared frame (a losing bulk also names its index), and the state is as if only the winner
//! had run: the loser's other frames are still allocated (they free afterwards), and every
//! frame is free exactly once at the end. A last pair of models races a bulk over both zones
//! of a node, which holds both zone locks at once, against a plain free in either zone.
#![cfg(numaframe_loom)]

use loom::sync::Arc;
use numaframe::node::DMA32_END;
use numaframe::{
    AllocFlags, BulkFreeError, FreeError, Machine, NodeId, Order, PcpConfig, Pfn, PhysRange,
    ZoneKind,
};
use numaframe_loom::{SparseMem, Tiny, assert_all_free, keep, model, race};

const N0: NodeId = NodeId::new(0);

/// Where the frames of a model come from.
#[derive(Clone, Copy, Debug)]
enum From {
    /// The zone: `alloc`, no pageblock lent.
    Zone,
    /// CPU 0's lent pageblock: `alloc_cpu`. The tuning keeps at most two free frames, so
    /// CPU 0's first free gives the pageblock back.
    Cpu,
}

/// A one-node machine with a CPU and three order-0 frames allocated `from`.
fn setup(from: From) -> (Arc<Machine<'static>>, [Pfn; 3]) {
    let m = Tiny::new(1, 64, &[]).boot_kept_with_cpus(&[N0], PcpConfig { batch: 1, high: 2 });
    let c0 = m.cpu(0).expect("cpu 0");
    let f = [0; 3].map(|_| {
        match from {
            From::Zone => m.alloc(N0, Order::ZERO, AllocFlags::THISNODE),
            From::Cpu => m.alloc_cpu(c0, Order::ZERO, AllocFlags::empty()),
        }
        .expect("memory")
    });
    (Arc::new(m), f)
}

/// The error a losing free of `p` may get: the frame is claimed by a bulk in progress, free,
/// or merged into a free block.
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
    assert_all_free(m);
}

/// A bulk of `[a, b]` against a free of `b` by `single` (plain or per-CPU).
fn bulk_against_single(from: From, single: fn(&Machine<'_>, Pfn) -> Result<(), FreeError>) {
    model(move || {
        let (m, [a, b, c]) = setup(from);
        let (bulk, single) = race(
            {
                let m = m.clone();
                move || single(&m, b)
            },
            || m.free_bulk(&[a, b]),
        );
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

fn plain_free(m: &Machine<'_>, p: Pfn) -> Result<(), FreeError> {
    m.free(p, Order::ZERO)
}

fn cpu0_free(m: &Machine<'_>, p: Pfn) -> Result<(), FreeError> {
    m.free_cpu(m.cpu(0).expect("cpu 0"), p, Order::ZERO)
}

#[test]
fn bulk_claim_races_a_plain_free() {
    bulk_against_single(From::Zone, plain_free);
}

#[test]
fn bulk_claim_races_a_per_cpu_free() {
    bulk_against_single(From::Zone, cpu0_free);
}

#[test]
fn bulk_claim_of_lent_frames_races_a_plain_free() {
    bulk_against_single(From::Cpu, plain_free);
}

/// CPU 0's free of its own frame swaps the state byte without the zone lock, then gives the
/// pageblock back under it.
#[test]
fn bulk_claim_of_lent_frames_races_the_holders_free() {
    bulk_against_single(From::Cpu, cpu0_free);
}

/// Bulks of `[a, b]` and `[b, c]`: whichever claims `b` first wins, the other rolls back its
/// own claim (of `a`, or of nothing) and reports a double free of `b` at its index, as a losing
/// plain free does (`Duplicate` would say that `b` appears twice in the loser's own slice,
/// which it does not).
fn two_bulks_share_a_frame(from: From) {
    model(move || {
        let (m, [a, b, c]) = setup(from);
        let (mine, theirs) = race(
            {
                let m = m.clone();
                move || m.free_bulk(&[b, c])
            },
            || m.free_bulk(&[a, b]),
        );
        let (error, held) = match (mine, theirs) {
            (Ok(()), Err(BulkFreeError { index: 0, error })) => (error, c),
            (Err(BulkFreeError { index: 1, error }), Ok(())) => (error, a),
            other => panic!("exactly one bulk wins, the other fails on b: {other:?}"),
        };
        assert!(lost(error, b), "{error:?}");
        settle(&m, &[held]);
    });
}

#[test]
fn a_bulk_losing_a_shared_frame_reports_a_double_free() {
    two_bulks_share_a_frame(From::Zone);
}

#[test]
fn a_bulk_losing_a_shared_lent_frame_reports_a_double_free() {
    two_bulks_share_a_frame(From::Cpu);
}

/// A bulk of `[b, a]` across both zones of a node (`a` in `Dma32`, `b` in `Normal`), which
/// locks them in ascending order whatever the slice's order, against a plain free of `shared`
/// (one of the two), which takes that zone's lock alone: between the bulk's two lock
/// acquisitions, or before, or after. Exactly one free of `shared` wins, and the loser changes
/// nothing.
fn bulk_across_zones_against_a_plain_free(shared_in_normal: bool) {
    model(move || {
        let start = DMA32_END.get() - 64;
        let range = PhysRange::new(Pfn::new(start), Pfn::new(start + 128)).expect("ordered");
        let tiny = keep(Tiny::one_node(range));
        let mem = keep(SparseMem::default());
        let m = Arc::new(tiny.boot(mem));
        let alloc = |flags| m.alloc(N0, Order::ZERO, flags).expect("memory");
        let a = alloc(AllocFlags::THISNODE | AllocFlags::DMA32);
        let b = alloc(AllocFlags::THISNODE);
        assert_eq!(
            (ZoneKind::of(a), ZoneKind::of(b)),
            (ZoneKind::Dma32, ZoneKind::Normal)
        );
        let (shared, other) = if shared_in_normal { (b, a) } else { (a, b) };
        let (bulk, single) = race(
            {
                let m = m.clone();
                move || m.free(shared, Order::ZERO)
            },
            || m.free_bulk(&[b, a]),
        );
        let index = if shared_in_normal { 0 } else { 1 };
        match (bulk, single) {
            (Ok(()), Err(e)) => assert!(lost(e, shared), "{e:?}"),
            (Err(BulkFreeError { index: i, error }), Ok(())) => {
                assert_eq!(i, index, "the bulk fails on the shared frame");
                assert!(lost(error, shared), "{error:?}");
                m.free(other, Order::ZERO)
                    .expect("still allocated: the losing bulk changed nothing");
            }
            other => panic!("exactly one free wins: {other:?}"),
        }
        assert_all_free(&m);
    });
}

#[test]
fn bulk_across_zones_races_a_free_in_the_first_zone_it_locks() {
    bulk_across_zones_against_a_plain_free(false);
}

#[test]
fn bulk_across_zones_races_a_free_in_the_second_zone_it_locks() {
    bulk_across_zones_against_a_plain_free(true);
}

/// A bulk that is refused (its last entry is foreign) claims a lent frame for a
/// moment; the holder's own free of that frame racing it must not lose to a bulk that frees
/// nothing: a refused bulk leaves the state as it was, so the single free is the only free of
/// the frame and must succeed.
#[test]
fn a_refused_bulk_does_not_make_the_holders_free_fail() {
    model(|| {
        let (m, [a, b, c]) = setup(From::Cpu);
        let foreign = Pfn::new(u64::MAX);
        let (bulk, single) = race(
            {
                let m = m.clone();
                move || cpu0_free(&m, b)
            },
            || m.free_bulk(&[b, foreign]),
        );
        // The bulk is refused: on its foreign entry, or on b if the single free came first.
        match bulk {
            Err(BulkFreeError {
                index: 1,
                error: FreeError::Foreign { pfn },
            }) => assert_eq!(pfn, foreign),
            Err(BulkFreeError { index: 0, error }) => assert!(lost(error, b), "{error:?}"),
            other => panic!("the bulk must be refused: {other:?}"),
        }
        assert_eq!(single, Ok(()), "the only free of b that can take effect");
        settle(&m, &[a, c]);
    });
}
