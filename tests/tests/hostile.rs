//! Hostile input through the public API: every entry point called with what a buggy platform,
//! operator or caller could hand it. Each call must return a typed error or an empty result,
//! leave the allocator's state unchanged (free pages and buddyinfo per zone, pools, caches,
//! compared before and after, then `check_invariants()`), and never panic.
//!
//! The README's "The allocator's promises" names these tests.

use numaframe::HugeSize;
use numaframe::hugetlb::cmdline;
use numaframe::interleave::{IlState, Weights, plan_bulk};
use numaframe::policy::{Policy, TaskPolicy, auto_weights};
use numaframe::zonelist::FallbackOptions;
use numaframe::{
    AllocFlags, BootError, BootOptions, BulkFreeError, FreeError, MAX_NODES, MAX_ORDER,
    MAX_SPANS_PER_ZONE, Machine, MemoryRange, NodeId, NodeInfo, NodeMask, OfflineError,
    OfflineOptions, Order, PAGE_SIZE, PcpConfig, Pfn, PhysAddr, PhysRange, PolicyError, TablePlace,
    Topology, TopologyError, ZoneKind,
};
use numaframe_hosted::readers::{parse_numactl, parse_toml};
use numaframe_hosted::sim::{Sim, SimMemory};
use numaframe_hosted::spec::{MachineSpec, NodeSpec};
use numaframe_testkit::{Snap, Spec, memory_range, node_info};

/// 4 GiB in frames: where `Dma32` ends.
const G4: u64 = 1 << 20;

fn n(i: usize) -> NodeId {
    NodeId::new(i)
}

fn range(start: u64, end: u64) -> PhysRange {
    PhysRange::new(Pfn::new(start), Pfn::new(end)).unwrap()
}

/// The standard machine's tables: the kit's two CPU nodes and a hot-add target (node 2, CPU-less
/// and memoryless, initiator 0; CPUs 0, 1, 2 on nodes 0, 1, 0). Node 0 straddles 4 GiB (a
/// `Dma32` and a `Normal` zone), node 1 lies at 8 GiB with room for a few 2 MiB pages.
fn standard() -> Spec {
    Spec::with_hot_add_target(vec![
        memory_range(0, G4 - 2048, G4 + 2048),
        memory_range(1, 2 * G4, 2 * G4 + 8 * 512 + 600),
    ])
}

/// Machine tables over simulated memory.
struct World {
    spec: Spec,
    mem: SimMemory,
}

impl World {
    /// `spec` over simulated memory below 64 GiB, so that hot-adds there can map their metadata.
    fn new(spec: Spec) -> World {
        World {
            spec,
            mem: SimMemory::new(&[(0, 64 << 30)]).unwrap(),
        }
    }

    /// The [`standard`] tables over 64 GiB.
    fn standard() -> World {
        World::new(standard())
    }

    fn boot(&self) -> Machine<'_> {
        self.boot_with(self.spec.options())
    }

    fn boot_with(&self, opts: BootOptions<'_>) -> Machine<'_> {
        let m = self.spec.boot_with(&self.mem, opts);
        m.check_invariants().unwrap();
        m
    }

    fn try_boot(&self, ranges: &[MemoryRange]) -> Result<Machine<'_>, BootError> {
        Machine::boot(
            self.spec.topology(),
            &self.mem,
            ranges,
            BootOptions {
                min_free_kbytes: Some(0),
                ..BootOptions::default()
            },
        )
    }
}

/// Boots the standard world's topology over fresh memory with other ranges: the error, if
/// any. (A boot that fails after mapping its tables leaves them mapped, so every attempt gets
/// its own memory.)
fn boot_error(ranges: &[MemoryRange]) -> Option<BootError> {
    World::standard().try_boot(ranges).err()
}

/// Runs `f`, which must be refused, and checks that it changed nothing.
fn unchanged<R>(m: &Machine<'_>, f: impl FnOnce() -> R) -> R {
    let before = Snap::of(m);
    let r = f();
    assert_eq!(Snap::of(m), before, "a refused call changed the machine");
    m.check_invariants().unwrap();
    r
}

fn free_err(m: &Machine<'_>, pfn: Pfn, order: Order) -> FreeError {
    unchanged(m, || m.free(pfn, order)).expect_err("misuse accepted by free")
}

fn free_huge_err(m: &Machine<'_>, pfn: Pfn, size: HugeSize) -> FreeError {
    unchanged(m, || m.free_huge(pfn, size)).expect_err("misuse accepted by free_huge")
}

fn free_bulk_err(m: &Machine<'_>, pfns: &[Pfn]) -> BulkFreeError {
    unchanged(m, || m.free_bulk(pfns)).expect_err("misuse accepted by free_bulk")
}

/// Every set of tables boot carved: the machine-wide ones, each node's, each CPU's.
fn table_places(m: &Machine<'_>) -> Vec<TablePlace> {
    let nodes = (0..m.topology().len()).map(|i| m.node_tables(n(i)).unwrap());
    let cpus = (0..m.cpu_count()).map(|i| m.cpu_tables(m.cpu(i).unwrap()).unwrap());
    std::iter::once(m.machine_tables())
        .chain(nodes)
        .chain(cpus)
        .collect()
}

/// `true` if `inner` lies inside `outer`.
fn within(inner: PhysRange, outer: PhysRange) -> bool {
    outer.start() <= inner.start() && inner.end() <= outer.end()
}

#[test]
fn out_of_range_pfns_are_foreign() {
    let w = World::standard();
    let m = w.boot();
    let c = m.cpu(0).unwrap();
    let g1 = HugeSize::Size1G;
    for pfn in [
        Pfn::new(0),
        Pfn::new(G4 - 2049),
        Pfn::new(3 * G4),
        Pfn::new(1 << 40),
        Pfn::new((1 << 52) - 1),
        Pfn::new(1 << 52),
        Pfn::new(u64::MAX),
    ] {
        assert_eq!(m.node_of(pfn), None);
        for order in [Order::ZERO, Order::HUGE_2M, Order::MAX] {
            if pfn.is_aligned(order) {
                assert_eq!(free_err(&m, pfn, order), FreeError::Foreign { pfn });
            }
        }
        assert_eq!(
            unchanged(&m, || m.free_cpu(c, pfn, Order::ZERO)),
            Err(FreeError::Foreign { pfn })
        );
        assert_eq!(
            free_bulk_err(&m, &[pfn]),
            BulkFreeError {
                index: 0,
                error: FreeError::Foreign { pfn }
            }
        );
        assert_eq!(free_huge_err(&m, pfn, g1), FreeError::Foreign { pfn });
    }
}

#[test]
fn wrong_orders_are_refused() {
    let w = World::standard();
    let m = w.boot();
    let c = m.cpu(1).unwrap();
    let p = m.alloc(n(1), Order::new(4), AllocFlags::empty()).unwrap();
    for k in 0..=MAX_ORDER {
        let order = Order::new(k);
        if k == 4 {
            continue;
        }
        let want = if p.is_aligned(order) {
            FreeError::WrongOrder {
                pfn: p,
                given: order,
                allocated: Order::new(4),
            }
        } else {
            FreeError::Misaligned { pfn: p, order }
        };
        assert_eq!(free_err(&m, p, order), want);
        assert_eq!(unchanged(&m, || m.free_cpu(c, p, order)), Err(want));
    }
    assert_eq!(
        free_bulk_err(&m, &[p]).error,
        FreeError::WrongOrder {
            pfn: p,
            given: Order::ZERO,
            allocated: Order::new(4)
        }
    );
    m.free(p, Order::new(4)).unwrap();
    m.check_invariants().unwrap();
}

#[test]
fn double_frees_are_refused() {
    let w = World::standard();
    let m = w.boot();
    let c = m.cpu(0).unwrap();
    // Through the zone: the block is free (or merged into a bigger free block).
    let p = m.alloc(n(0), Order::new(2), AllocFlags::empty()).unwrap();
    m.free(p, Order::new(2)).unwrap();
    let e = free_err(&m, p, Order::new(2));
    assert!(
        matches!(
            e,
            FreeError::DoubleFree { .. } | FreeError::NotAllocated { .. }
        ),
        "{e:?}"
    );
    // Through a CPU cache: the frame sits in the cache, tagged, and every path refuses it.
    let q = m.alloc_cpu(c, Order::ZERO, AllocFlags::empty()).unwrap();
    m.free_cpu(c, q, Order::ZERO).unwrap();
    assert!(m.cached_pages() > 0);
    let other = m.cpu(1).unwrap();
    assert_eq!(
        unchanged(&m, || m.free_cpu(c, q, Order::ZERO)),
        Err(FreeError::DoubleFree { pfn: q })
    );
    assert_eq!(
        unchanged(&m, || m.free_cpu(other, q, Order::ZERO)),
        Err(FreeError::DoubleFree { pfn: q })
    );
    assert_eq!(
        free_err(&m, q, Order::ZERO),
        FreeError::DoubleFree { pfn: q }
    );
    assert_eq!(
        free_bulk_err(&m, &[q]).error,
        FreeError::DoubleFree { pfn: q }
    );
    // Within one bulk free: the duplicate is named, and nothing is freed.
    let mut out = [Pfn::new(0); 8];
    assert_eq!(m.alloc_bulk(n(1), AllocFlags::empty(), &mut out), 8);
    let dup = [out[0], out[1], out[2], out[1], out[3]];
    assert_eq!(
        free_bulk_err(&m, &dup),
        BulkFreeError {
            index: 3,
            error: FreeError::Duplicate { pfn: out[1] }
        }
    );
    m.free_bulk(&out).unwrap();
    let e = free_bulk_err(&m, &out).error;
    assert!(
        matches!(
            e,
            FreeError::DoubleFree { .. } | FreeError::NotAllocated { .. }
        ),
        "{e:?}"
    );
    // A pool page returned twice.
    assert_eq!(m.reserve_huge(n(1), HugeSize::Size2M, 1), 1);
    let h = m.alloc_huge(n(1), HugeSize::Size2M).unwrap();
    m.free_huge(h, HugeSize::Size2M).unwrap();
    assert_eq!(
        free_huge_err(&m, h, HugeSize::Size2M),
        FreeError::DoubleFree { pfn: h }
    );
    m.check_invariants().unwrap();
}

/// A refused bulk free leaves nothing behind that later calls could see: a twin machine that
/// never saw it, given the same calls afterwards, reports the same counters. The bulk frees
/// into a clean pageblock, which it gives an extra plane to keep its clean frames apart; the
/// undo must take that plane away again, or the pageblock, once a CPU lends it and gives it
/// back with a dirty frame, tracks its dirty frames one by one where the twin marks them all.
#[test]
fn a_refused_bulk_free_leaves_the_machine_as_its_twin() {
    fn zeroed(w: &World) -> BootOptions<'_> {
        BootOptions {
            zeroed: true,
            ..w.spec.options()
        }
    }
    // Each case: the refused bulk, from the frame `x` both machines allocated.
    let cases: [fn(Pfn) -> Vec<Pfn>; 2] = [
        // A duplicate: the first entry goes through the pageblock's run, then the refusal.
        |x| vec![x, x],
        // A free frame of the same pageblock: both entries go frame by frame.
        |x| vec![x, Pfn::new(x.get() + 1)],
    ];
    for (i, bulk) in cases.iter().enumerate() {
        let (wa, wb) = (World::standard(), World::standard());
        let (a, b) = (wa.boot_with(zeroed(&wa)), wb.boot_with(zeroed(&wb)));
        let x = a.alloc(n(0), Order::ZERO, AllocFlags::empty()).unwrap();
        assert_eq!(b.alloc(n(0), Order::ZERO, AllocFlags::empty()), Some(x));
        free_bulk_err(&a, &bulk(x));
        let counters = |m: &Machine<'_>| -> Vec<_> {
            m.nodes()
                .iter()
                .flat_map(|node| ZoneKind::ALL.map(|k| node.zone(k).counters()))
                .collect()
        };
        for m in [&a, &b] {
            // CPU 0 borrows `x`'s pageblock and gives it back with one dirty frame.
            let c = m.cpu(0).unwrap();
            let y = m.alloc_cpu(c, Order::ZERO, AllocFlags::empty()).unwrap();
            assert_eq!(y.get() >> 9, x.get() >> 9, "case {i}: the same pageblock");
            m.free_cpu(c, y, Order::ZERO).unwrap();
            m.drain_all();
            m.free(x, Order::ZERO).unwrap();
            m.check_invariants().unwrap();
        }
        assert_eq!(counters(&a), counters(&b), "case {i}");
        assert_eq!(Snap::of(&a), Snap::of(&b), "case {i}");
    }
}

#[test]
fn foreign_frames_are_refused() {
    let w = World::standard();
    let m = w.boot();
    // A frame of another machine, at an address this one does not have.
    let other = World::new(Spec {
        ranges: vec![
            memory_range(0, 5 * G4, 5 * G4 + 4096),
            memory_range(1, 6 * G4, 6 * G4 + 4096),
        ],
        ..standard()
    });
    let m2 = other.boot();
    let theirs = m2.alloc(n(0), Order::ZERO, AllocFlags::empty()).unwrap();
    assert_eq!(
        free_err(&m, theirs, Order::ZERO),
        FreeError::Foreign { pfn: theirs }
    );
    // The metadata at the end of each range, and the boot tables, are not frames to free.
    for r in &w.spec.ranges {
        let last = Pfn::new(r.range.end().get() - 1);
        assert_eq!(m.node_of(last), None, "{last:?} is the allocator's own");
        assert_eq!(
            free_err(&m, last, Order::ZERO),
            FreeError::Foreign { pfn: last }
        );
    }
    for place in table_places(&m) {
        let f = place.frames;
        for pfn in [f.start(), Pfn::new(f.end().get() - 1)] {
            assert_eq!(m.node_of(pfn), None, "{pfn:?} holds tables ({place:?})");
            assert_eq!(free_err(&m, pfn, Order::ZERO), FreeError::Foreign { pfn });
        }
    }
    // Between the two ranges.
    let hole = Pfn::new(G4 + 4096);
    assert_eq!(
        free_err(&m, hole, Order::ZERO),
        FreeError::Foreign { pfn: hole }
    );
    m2.free(theirs, Order::ZERO).unwrap();
}

#[test]
fn misaligned_and_interior_frames_are_refused() {
    let w = World::standard();
    let m = w.boot();
    let c = m.cpu(0).unwrap();
    let p = m.alloc(n(1), Order::new(3), AllocFlags::empty()).unwrap();
    for off in 1..8 {
        let q = Pfn::new(p.get() + off);
        assert_eq!(
            free_err(&m, q, Order::new(3)),
            FreeError::Misaligned {
                pfn: q,
                order: Order::new(3)
            }
        );
        // Inside the block: no block starts there.
        assert_eq!(
            free_err(&m, q, Order::ZERO),
            FreeError::NotAllocated { pfn: q }
        );
        assert_eq!(
            unchanged(&m, || m.free_cpu(c, q, Order::ZERO)),
            Err(FreeError::NotAllocated { pfn: q })
        );
        assert_eq!(
            free_bulk_err(&m, &[q]).error,
            FreeError::NotAllocated { pfn: q }
        );
    }
    // A free frame that was never handed out.
    let untouched = Pfn::new(2 * G4 + 4096);
    let e = free_err(&m, untouched, Order::ZERO);
    assert!(
        matches!(
            e,
            FreeError::NotAllocated { .. } | FreeError::DoubleFree { .. }
        ),
        "{e:?}"
    );
    m.free(p, Order::new(3)).unwrap();
}

#[test]
fn huge_pages_freed_as_small_are_refused() {
    let w = World::standard();
    let m = w.boot();
    let c = m.cpu(1).unwrap();
    assert_eq!(m.reserve_huge(n(1), HugeSize::Size2M, 2), 2);
    let h = m.alloc_huge(n(1), HugeSize::Size2M).unwrap();
    for order in [Order::ZERO, Order::new(1), Order::HUGE_2M] {
        assert_eq!(free_err(&m, h, order), FreeError::HugePage { pfn: h });
        assert_eq!(
            unchanged(&m, || m.free_cpu(c, h, order)),
            Err(FreeError::HugePage { pfn: h })
        );
    }
    assert_eq!(
        free_bulk_err(&m, &[h]).error,
        FreeError::HugePage { pfn: h }
    );
    // A page free in its pool is not a small block either.
    let pooled = {
        let q = m.alloc_huge(n(1), HugeSize::Size2M).unwrap();
        m.free_huge(q, HugeSize::Size2M).unwrap();
        q
    };
    let e = free_err(&m, pooled, Order::HUGE_2M);
    assert!(
        matches!(e, FreeError::DoubleFree { .. } | FreeError::HugePage { .. }),
        "{e:?}"
    );
    // The wrong size: not aligned to 1 GiB, or the wrong order.
    let e = free_huge_err(&m, h, HugeSize::Size1G);
    assert!(
        matches!(
            e,
            FreeError::Misaligned { .. } | FreeError::WrongOrder { .. }
        ),
        "{e:?}"
    );
    m.free_huge(h, HugeSize::Size2M).unwrap();
    assert_eq!(m.release_huge(n(1), HugeSize::Size2M, u64::MAX), 2);
    m.check_invariants().unwrap();
}

#[test]
fn small_blocks_freed_as_huge_are_refused() {
    let w = World::standard();
    let m = w.boot();
    let b = m.alloc(n(1), Order::HUGE_2M, AllocFlags::empty()).unwrap();
    assert_eq!(
        free_huge_err(&m, b, HugeSize::Size2M),
        FreeError::NotAllocated { pfn: b }
    );
    let s = m.alloc(n(1), Order::ZERO, AllocFlags::empty()).unwrap();
    let e = free_huge_err(&m, s, HugeSize::Size2M);
    assert!(
        matches!(
            e,
            FreeError::Misaligned { .. } | FreeError::WrongOrder { .. }
        ),
        "{e:?}"
    );
    m.free(b, Order::HUGE_2M).unwrap();
    m.free(s, Order::ZERO).unwrap();
    m.check_invariants().unwrap();
}

#[test]
fn unknown_cpus_are_refused() {
    let w = World::standard();
    let m = w.boot();
    assert_eq!(m.cpu(3), None);
    assert_eq!(m.cpu(usize::MAX), None);
    // A CPU id of a machine with more CPUs.
    let big = World::new(Spec {
        cpus: vec![n(0); 8],
        ..standard()
    });
    let donor = big.boot();
    let stranger = donor.cpu(7).unwrap();
    let p = m.alloc(n(0), Order::ZERO, AllocFlags::empty()).unwrap();
    assert_eq!(m.cpu_node(stranger), None);
    assert_eq!(
        unchanged(&m, || m.alloc_cpu(
            stranger,
            Order::ZERO,
            AllocFlags::empty()
        )),
        None
    );
    assert_eq!(
        unchanged(&m, || m.free_cpu(stranger, p, Order::ZERO)),
        Err(FreeError::UnknownCpu { cpu: 7 })
    );
    unchanged(&m, || m.drain_cpu(stranger));
    m.free(p, Order::ZERO).unwrap();
}

#[test]
fn empty_masks_are_refused() {
    let w = World::standard();
    let m = w.boot();
    let empty = NodeMask::EMPTY;
    for policy in [
        Policy::PreferredMany(empty),
        Policy::Bind(empty),
        Policy::Interleave(empty),
        Policy::WeightedInterleave(empty),
    ] {
        for socket_aware in [false, true] {
            assert_eq!(
                TaskPolicy::new(&m, policy, socket_aware).unwrap_err(),
                PolicyError::EmptyMask
            );
        }
    }
    assert_eq!(
        Weights::auto(&[Some(1)], &empty),
        Err(PolicyError::EmptyMask)
    );
    assert_eq!(
        auto_weights(m.topology(), &empty),
        Err(PolicyError::EmptyMask)
    );
    let mut il = IlState::new();
    assert_eq!(il.next_node(&empty, &Weights::default()), None);
    assert_eq!(il, IlState::new());
    plan_bulk(&mut il, &empty, &Weights::default(), 100, |node, count| {
        panic!("an empty mask emitted {count} pages on {node:?}")
    });
    assert_eq!(il, IlState::new());
    assert_eq!(m.topology().nearest_nodes(n(0), &empty), NodeMask::EMPTY);
}

#[test]
fn zero_weights_are_refused() {
    let w = World::standard();
    let m = w.boot();
    m.set_weights(Weights::new(&[3, 2, 1]).unwrap());
    let before = m.weights();
    assert_eq!(
        Weights::new(&[3, 0, 1]),
        Err(PolicyError::ZeroWeight { node: n(1) })
    );
    assert_eq!(
        Weights::new(&[0]),
        Err(PolicyError::ZeroWeight { node: n(0) })
    );
    assert_eq!(
        Weights::new(&[1; MAX_NODES + 1]),
        Err(PolicyError::WeightCount {
            given: MAX_NODES + 1,
            nodes: MAX_NODES
        })
    );
    // A refused table never reaches the machine; the accepted ones are 1..=255 throughout.
    assert_eq!(m.weights(), before);
    let all = Weights::new(&[255; MAX_NODES]).unwrap();
    assert!((0..MAX_NODES).all(|i| all.get(n(i)) == 255));
    // Bandwidth 0 everywhere gives weight 1, never 0.
    let w0 = Weights::auto(&[Some(0), Some(0)], &NodeMask::first_n(2)).unwrap();
    assert_eq!((w0.get(n(0)), w0.get(n(1))), (1, 1));
    let huge = Weights::auto(&[Some(u32::MAX); MAX_NODES], &NodeMask::first_n(MAX_NODES)).unwrap();
    assert!((0..MAX_NODES).all(|i| huge.get(n(i)) >= 1));
}

#[test]
fn unknown_nodes_are_refused() {
    let w = World::standard();
    let m = w.boot();
    let (ghost, far) = (n(3), n(MAX_NODES - 1));
    for bad in [ghost, far] {
        unchanged(&m, || {
            assert_eq!(m.node(bad).map(|x| x.id()), None);
            assert_eq!(m.numastat(bad), None);
            assert_eq!(m.alloc(bad, Order::ZERO, AllocFlags::empty()), None);
            assert_eq!(m.alloc(bad, Order::ZERO, AllocFlags::THISNODE), None);
            assert_eq!(
                m.alloc_from(n(0), bad, Order::ZERO, AllocFlags::empty()),
                None
            );
            let mut out = [Pfn::new(0); 4];
            assert_eq!(m.alloc_bulk(bad, AllocFlags::empty(), &mut out), 0);
            assert_eq!(
                m.alloc_bulk_from(n(0), bad, AllocFlags::empty(), &mut out),
                0
            );
            assert_eq!(m.alloc_huge(bad, HugeSize::Size2M), None);
            assert_eq!(m.reserve_huge(bad, HugeSize::Size2M, 10), 0);
            assert_eq!(m.release_huge(bad, HugeSize::Size2M, 10), 0);
            assert_eq!(
                m.huge_counts(bad, HugeSize::Size1G),
                numaframe::HugeCounts { total: 0, free: 0 }
            );
            let mut row = [n(0); 4];
            assert_eq!(m.fallback_order(bad, &mut row), 0);
            assert!(!m.topology().contains(bad));
            assert!(
                m.topology()
                    .nearest_nodes(bad, &NodeMask::first_n(3))
                    .is_empty()
            );
        });
        assert_eq!(
            TaskPolicy::new(&m, Policy::Preferred(bad), false).unwrap_err(),
            PolicyError::UnknownNode { node: bad }
        );
        let mask = NodeMask::from_nodes([n(0), bad]);
        for policy in [
            Policy::PreferredMany(mask),
            Policy::Bind(mask),
            Policy::Interleave(mask),
            Policy::WeightedInterleave(mask),
        ] {
            assert_eq!(
                TaskPolicy::new(&m, policy, true).unwrap_err(),
                PolicyError::UnknownNode { node: bad }
            );
        }
        assert_eq!(
            auto_weights(m.topology(), &mask),
            Err(PolicyError::UnknownNode { node: bad })
        );
        assert_eq!(
            unchanged(&m, || m.hot_add(
                &w.mem,
                bad,
                range(3 * G4, 3 * G4 + 4096),
                FallbackOptions::default()
            )),
            Err(BootError::UnknownNode { node: bad })
        );
    }
    // A policy's CPU node outside the machine: the local policy finds nothing.
    let mut local = TaskPolicy::new(&m, Policy::Local, false).unwrap();
    assert_eq!(
        unchanged(&m, || local.alloc(
            &m,
            ghost,
            Order::ZERO,
            AllocFlags::empty()
        )),
        None
    );
    let mut out = [Pfn::new(0); 4];
    assert_eq!(
        unchanged(&m, || local.alloc_bulk(
            &m,
            ghost,
            AllocFlags::empty(),
            &mut out
        ))
        .placed,
        0
    );
    // Boot with a CPU or memory on a node the topology does not have.
    let cpus = [n(0), ghost];
    let opts = BootOptions {
        cpus: &cpus,
        ..BootOptions::default()
    };
    assert_eq!(
        Machine::boot(w.spec.topology(), &w.mem, &w.spec.ranges, opts).unwrap_err(),
        BootError::UnknownNode { node: ghost }
    );
    let stray = [
        w.spec.ranges[0],
        w.spec.ranges[1],
        MemoryRange {
            node: ghost,
            range: range(3 * G4, 3 * G4 + 4096),
        },
    ];
    assert_eq!(
        boot_error(&stray).unwrap(),
        BootError::UnknownNode { node: ghost }
    );
    assert_eq!(NodeId::try_new(MAX_NODES), None);
    assert_eq!(Order::try_new(MAX_ORDER + 1), None);
}

#[test]
fn socket_aware_policy_on_a_smaller_machine_does_not_panic() {
    // TaskPolicy::new checks the mask against the machine it is given; the allocation calls
    // take any machine. The nodes that machine lacks are never used, and the socket-aware
    // package lookup must not index its topology with them.
    let big = World::new(Spec {
        cpus: standard().cpus,
        ..Spec::uniform(3, 4096, 0)
    });
    let small = World {
        spec: Spec::uniform(1, 4096, 0).with_cpus(&[0]),
        mem: SimMemory::new(&[(0, 64 << 20)]).unwrap(),
    };
    let mb = big.boot();
    let ms = small.boot();
    for socket_aware in [false, true] {
        for policy in [
            Policy::Preferred(n(2)),
            Policy::PreferredMany(NodeMask::from_nodes([n(1), n(2)])),
            Policy::Bind(NodeMask::from_nodes([n(1), n(2)])),
            Policy::Interleave(NodeMask::first_n(3)),
            Policy::WeightedInterleave(NodeMask::first_n(3)),
        ] {
            let mut p = TaskPolicy::new(&mb, policy, socket_aware).unwrap();
            for _ in 0..4 {
                if let Some(q) = p.alloc(&ms, n(0), Order::ZERO, AllocFlags::empty()) {
                    assert_eq!(ms.node_of(q), Some(n(0)));
                    ms.free(q, Order::ZERO).unwrap();
                }
                let mut out = [Pfn::new(0); 5];
                let r = p.alloc_bulk(&ms, n(0), AllocFlags::empty(), &mut out);
                ms.free_bulk(&out[..r.placed]).unwrap();
                assert_eq!(p.alloc_huge(&ms, n(0), HugeSize::Size2M), None);
                let _ = p.il_report(&ms, n(0));
            }
            ms.check_invariants().unwrap();
        }
    }
}

#[test]
fn topology_of_1024_nodes_validates_and_1025_is_refused() {
    let nodes = MAX_NODES;
    let infos = vec![node_info(true, true); nodes];
    let distances: Vec<u8> = (0..nodes * nodes)
        .map(|i| {
            if i / nodes == i % nodes {
                10
            } else {
                20 + (i % 7) as u8
            }
        })
        .collect();
    let t = Topology::new(&distances, &infos).unwrap();
    assert_eq!(t.len(), MAX_NODES);
    assert_eq!(t.distance(n(1023), n(1023)), 10);
    assert_eq!(t.cpu_nodes().count(), MAX_NODES);
    let too_many = vec![node_info(true, true); nodes + 1];
    let d = vec![10u8; (nodes + 1) * (nodes + 1)];
    assert_eq!(
        Topology::new(&d, &too_many).unwrap_err(),
        TopologyError::TooManyNodes { nodes: nodes + 1 }
    );
}

/// 1024 nodes of `bytes` each, distance 10 local and 20 remote, CPU `i` on node `i`.
fn spec_1024(bytes: u64) -> MachineSpec {
    let nodes = (0..MAX_NODES)
        .map(|i| NodeSpec {
            cpus: vec![i as u32],
            memory_bytes: bytes,
            ..NodeSpec::default()
        })
        .collect();
    let distances = (0..MAX_NODES * MAX_NODES)
        .map(|i| {
            if i / MAX_NODES == i % MAX_NODES {
                10
            } else {
                20
            }
        })
        .collect();
    MachineSpec::new("1024", nodes, distances, None).unwrap()
}

#[test]
fn machine_of_1024_nodes_boots_and_serves_every_node() {
    let spec = spec_1024(64 << 20);
    let sim = Sim::new(&spec).unwrap();
    // 64 CPUs, as on a 64-CPU host split with numa=fake=1024.
    let cpus: Vec<NodeId> = (0..64).map(|i| n(i * 16)).collect();
    let m = sim
        .boot(BootOptions {
            cpus: &cpus,
            ..BootOptions::default()
        })
        .unwrap();
    m.check_invariants().unwrap();
    assert_eq!(m.memory_nodes().count(), MAX_NODES);
    let mut row = vec![n(0); MAX_NODES];
    assert_eq!(m.fallback_order(n(1023), &mut row), MAX_NODES);
    assert_eq!(row[0], n(1023));
    // Every node serves its own frame, and an interleave over all of them spreads evenly.
    let mut got = Vec::new();
    for i in 0..MAX_NODES {
        let p = m.alloc(n(i), Order::ZERO, AllocFlags::THISNODE).unwrap();
        assert_eq!(m.node_of(p), Some(n(i)));
        got.push(p);
    }
    let mut task =
        TaskPolicy::new(&m, Policy::Interleave(NodeMask::first_n(MAX_NODES)), false).unwrap();
    let mut out = vec![Pfn::new(0); 2 * MAX_NODES];
    let r = task.alloc_bulk(&m, n(0), AllocFlags::empty(), &mut out);
    assert_eq!(r.placed, 2 * MAX_NODES);
    assert!(r.node_calls <= MAX_NODES);
    m.check_invariants().unwrap();
    m.free_bulk(&got).unwrap();
    m.free_bulk(&out).unwrap();
    let c = m.cpu(63).unwrap();
    let p = m.alloc_cpu(c, Order::ZERO, AllocFlags::empty()).unwrap();
    assert_eq!(m.node_of(p), Some(n(63 * 16)));
    m.free_cpu(c, p, Order::ZERO).unwrap();
    m.drain_all();
    m.check_invariants().unwrap();
}

#[test]
fn machine_of_1024_small_nodes_boots_and_serves_every_node() {
    // 1024 nodes of 1 MiB and a CPU on each: every node holds its own metadata, its own tables
    // (its zones and fallback order) and its CPU's cache; node 0 holds the machine-wide tables
    // as well.
    let spec = spec_1024(1 << 20);
    let sim = Sim::new(&spec).unwrap();
    let cpus: Vec<NodeId> = (0..MAX_NODES).map(n).collect();
    let m = sim
        .boot(BootOptions {
            cpus: &cpus,
            ..BootOptions::default()
        })
        .unwrap();
    m.check_invariants().unwrap();
    assert_eq!(m.memory_nodes().count(), MAX_NODES);
    let mut row = vec![n(0); MAX_NODES];
    assert_eq!(m.fallback_order(n(1023), &mut row), MAX_NODES);
    assert_eq!(row[0], n(1023));
    let home = |node: usize| sim.ranges()[node].range;
    assert_eq!(m.machine_tables().host, n(0));
    assert!(within(m.machine_tables().frames, home(0)));
    // Each node's tables and its CPU's lie in its own memory, and it serves frames through
    // both APIs.
    for i in 0..MAX_NODES {
        assert_eq!(sim.ranges()[i].node, n(i));
        let cpu = m.cpu(i).unwrap();
        for place in [m.node_tables(n(i)).unwrap(), m.cpu_tables(cpu).unwrap()] {
            assert_eq!(place.host, n(i), "{place:?}");
            assert!(within(place.frames, home(i)), "{place:?}");
        }
        let p = m.alloc(n(i), Order::ZERO, AllocFlags::THISNODE).unwrap();
        let q = m.alloc_cpu(cpu, Order::ZERO, AllocFlags::empty()).unwrap();
        assert_eq!([m.node_of(p), m.node_of(q)], [Some(n(i)); 2]);
        m.free(p, Order::ZERO).unwrap();
        m.free_cpu(cpu, q, Order::ZERO).unwrap();
    }
    let mut task =
        TaskPolicy::new(&m, Policy::Interleave(NodeMask::first_n(MAX_NODES)), false).unwrap();
    let mut out = vec![Pfn::new(0); 2 * MAX_NODES];
    let r = task.alloc_bulk(&m, n(0), AllocFlags::empty(), &mut out);
    assert_eq!(r.placed, 2 * MAX_NODES);
    m.free_bulk(&out).unwrap();
    m.drain_all();
    m.check_invariants().unwrap();
}

/// The standard topology with CPUs on all three nodes, node 1 nearer to node 2 (15) than node 0
/// is (30), node 0's memory at frame 0 and node 1's at 12 GiB, of the given sizes.
fn room_world(frames0: u64, frames1: u64) -> World {
    World::new(
        Spec {
            distances: vec![10, 20, 30, 20, 10, 15, 30, 15, 10],
            ..Spec::with_hot_add_target(vec![
                memory_range(0, 0, frames0),
                memory_range(1, 3 * G4, 3 * G4 + frames1),
            ])
        }
        .with_cpus(&[0, 1, 2]),
    )
}

/// Boots a [`room_world`]: every place of its tables, or the boot's error.
fn room_boot(frames0: u64, frames1: u64) -> Result<Vec<TablePlace>, BootError> {
    let w = room_world(frames0, frames1);
    let m = w.spec.try_boot_with(&w.mem, w.spec.options())?;
    m.check_invariants().unwrap();
    Ok(table_places(&m))
}

#[test]
fn tables_without_room_at_home_go_to_the_nearest_node_with_room() {
    // With room everywhere, each node's tables and its CPU's are at home; node 2 has no memory
    // and node 1 is its nearest node with memory.
    let roomy = room_boot(8192, 8192).unwrap();
    let hosts: Vec<usize> = roomy.iter().map(|p| p.host.index()).collect();
    // Machine-wide; nodes 0, 1, 2; CPUs 0, 1, 2 (on nodes 0, 1, 2).
    assert_eq!(hosts, [0, 0, 1, 1, 0, 1, 1]);
    let (machine_frames, node0_frames) = (roomy[0].frames.frames(), roomy[1].frames.frames());
    // The smallest node 1 that boots keeps one frame to manage and no room for tables: node 1's
    // and node 2's tables, and their CPUs' caches, go to node 0, the nearest node with room.
    let small1 = (1..256)
        .find(|&f| room_boot(8192, f).is_ok())
        .expect("a node 1 of 256 frames boots");
    assert_eq!(
        room_boot(8192, small1 - 1),
        Err(BootError::BadRange {
            start: Pfn::new(3 * G4)
        })
    );
    for place in room_boot(8192, small1).unwrap() {
        assert_eq!(place.host, n(0), "{place:?}");
        assert!(within(place.frames, range(0, 8192)), "{place:?}");
    }
    // The smallest node 0 that holds the machine-wide tables has one frame of room left: too
    // little for its own tables, and no node has more. Boot says whose tables found no room,
    // and how many frames they need.
    let small0 = (1..8192)
        .find(|&f| {
            !matches!(
                room_boot(f, small1),
                Err(BootError::BadRange { .. } | BootError::NoBootMemory)
            )
        })
        .expect("a node 0 of 8192 frames holds the machine-wide tables");
    assert!(machine_frames < small0);
    assert_eq!(
        room_boot(small0, small1),
        Err(BootError::NoRoomForTables {
            node: n(0),
            frames: node0_frames
        })
    );
}

#[test]
fn machines_without_memory_do_not_boot() {
    // No node has memory, and no range is given.
    let infos = [
        NodeInfo {
            has_cpus: true,
            ..NodeInfo::default()
        },
        NodeInfo::default(),
    ];
    let distances = [10, 20, 20, 10];
    let mem = SimMemory::new(&[(0, 1 << 30)]).unwrap();
    let topo = Topology::new(&distances, &infos).unwrap();
    assert_eq!(
        Machine::boot(topo, &mem, &[], BootOptions::default()).unwrap_err(),
        BootError::NoBootMemory
    );
    // The topology says node 0 has memory, but no range is given.
    assert_eq!(
        boot_error(&[]).unwrap(),
        BootError::MemoryStateMismatch { node: n(0) }
    );
    // Ranges too small to hold their own metadata.
    let tiny = [
        MemoryRange {
            node: n(0),
            range: range(0, 1),
        },
        MemoryRange {
            node: n(1),
            range: range(8, 9),
        },
    ];
    assert_eq!(
        boot_error(&tiny).unwrap(),
        BootError::BadRange { start: Pfn::new(0) }
    );
    // Ranges that hold their metadata and the machine-wide tables, but not the nodes' own.
    let small = [
        MemoryRange {
            node: n(0),
            range: range(0, 20),
        },
        MemoryRange {
            node: n(1),
            range: range(40, 60),
        },
    ];
    assert!(
        matches!(
            boot_error(&small).unwrap(),
            BootError::NoRoomForTables { node, .. } if node == n(0)
        ),
        "{:?}",
        boot_error(&small)
    );
    // A simulated machine whose nodes all have 0 bytes.
    let spec = MachineSpec::new(
        "empty",
        vec![
            NodeSpec {
                cpus: vec![0],
                ..NodeSpec::default()
            },
            NodeSpec::default(),
        ],
        vec![10, 20, 20, 10],
        None,
    )
    .unwrap();
    let sim = Sim::new(&spec).unwrap();
    assert_eq!(
        sim.boot(BootOptions::default()).unwrap_err(),
        BootError::NoBootMemory
    );
}

#[test]
fn bad_topology_tables_are_refused() {
    let two = [node_info(true, true), node_info(true, true)];
    assert_eq!(Topology::new(&[], &[]).unwrap_err(), TopologyError::NoNodes);
    assert_eq!(
        Topology::new(&[10], &[]).unwrap_err(),
        TopologyError::NoNodes
    );
    for d in [
        &[][..],
        &[10][..],
        &[10, 20, 20][..],
        &[10, 20, 20, 10, 20][..],
    ] {
        assert_eq!(
            Topology::new(d, &two).unwrap_err(),
            TopologyError::DistanceTableSize {
                nodes: 2,
                entries: d.len()
            }
        );
    }
    // The diagonal must be 10.
    for diag in [0, 9, 11, 20, 254, 255] {
        assert_eq!(
            Topology::new(&[10, 20, 20, diag], &two).unwrap_err(),
            TopologyError::BadDistance {
                from: n(1),
                to: n(1),
                distance: diag
            }
        );
    }
    // Off the diagonal, at least 10 (a remote 10 is what numa=fake builds).
    for d in [0, 1, 9] {
        assert_eq!(
            Topology::new(&[10, d, 20, 10], &two).unwrap_err(),
            TopologyError::BadDistance {
                from: n(0),
                to: n(1),
                distance: d
            }
        );
    }
    for d in [10, 11, 254, 255] {
        assert!(Topology::new(&[10, d, d, 10], &two).is_ok(), "{d}");
    }
    // Initiators: out of range, CPU-less, on a CPU node, itself.
    let cpuless = NodeInfo {
        has_memory: true,
        ..NodeInfo::default()
    };
    for (infos, want) in [
        (
            [
                node_info(true, true),
                NodeInfo {
                    initiator: Some(n(5)),
                    ..cpuless
                },
            ],
            TopologyError::BadInitiator {
                node: n(1),
                initiator: n(5),
            },
        ),
        (
            [
                cpuless,
                NodeInfo {
                    initiator: Some(n(0)),
                    ..cpuless
                },
            ],
            TopologyError::BadInitiator {
                node: n(1),
                initiator: n(0),
            },
        ),
        (
            [
                cpuless,
                NodeInfo {
                    initiator: Some(n(1)),
                    ..cpuless
                },
            ],
            TopologyError::BadInitiator {
                node: n(1),
                initiator: n(1),
            },
        ),
        (
            [
                NodeInfo {
                    initiator: Some(n(1)),
                    ..node_info(true, true)
                },
                node_info(true, true),
            ],
            TopologyError::InitiatorOnCpuNode { node: n(0) },
        ),
    ] {
        assert_eq!(Topology::new(&[10, 20, 20, 10], &infos).unwrap_err(), want);
    }
}

#[test]
fn bad_memory_ranges_are_refused_at_boot() {
    let w = World::standard();
    let [r0, r1] = [w.spec.ranges[0], w.spec.ranges[1]];
    let on = |node, start, end| MemoryRange {
        node: n(node),
        range: range(start, end),
    };
    let s0 = r0.range.start().get();
    // Overlaps: identical, partial, nested, across nodes.
    for (layout, start) in [
        (vec![r0, r0, r1], r0.range.start()),
        (vec![r0, on(1, s0 + 100, s0 + 9000)], Pfn::new(s0 + 100)),
        (vec![r0, r1, on(0, s0 + 10, s0 + 20)], Pfn::new(s0 + 10)),
    ] {
        assert_eq!(boot_error(&layout).unwrap(), BootError::Overlap { start });
    }
    // Empty, beyond 2^52 frames, at the very top.
    for bad in [
        range(5 * G4, 5 * G4),
        range((1 << 52) - 4096, (1 << 52) + 1),
        range(u64::MAX - 4096, u64::MAX),
    ] {
        let layout = [
            r0,
            r1,
            MemoryRange {
                node: n(1),
                range: bad,
            },
        ];
        assert_eq!(
            boot_error(&layout).unwrap(),
            BootError::BadRange { start: bad.start() }
        );
    }
    // Memory on a node the topology calls memoryless.
    let layout = [r0, r1, on(2, 5 * G4, 5 * G4 + 4096)];
    assert_eq!(
        boot_error(&layout).unwrap(),
        BootError::MemoryStateMismatch { node: n(2) }
    );
    // A range of 2^36 frames (256 TiB): a span holds fewer than 2^27 pageblocks.
    let huge = on(1, 2 * G4, 2 * G4 + (1 << 36));
    assert_eq!(
        boot_error(&[r0, huge]).unwrap(),
        BootError::BadRange {
            start: huge.range.start()
        }
    );
    // More ranges in one zone than it holds.
    let mut many = vec![r0];
    for i in 0..=MAX_SPANS_PER_ZONE as u64 {
        many.push(on(1, 2 * G4 + i * 8192, 2 * G4 + i * 8192 + 4096));
    }
    let e = boot_error(&many).unwrap();
    assert!(
        matches!(e, BootError::BadRange { .. } | BootError::TooManyRanges),
        "{e:?}"
    );
    // Byte ranges that are not whole frames never become a PhysRange.
    assert_eq!(PhysRange::from_bytes(PhysAddr::new(1), PAGE_SIZE), None);
    assert_eq!(PhysRange::from_bytes(PhysAddr::new(0), PAGE_SIZE + 1), None);
    assert_eq!(
        PhysRange::from_bytes(PhysAddr::new(!0xfff), 2 * PAGE_SIZE),
        None
    );
    assert_eq!(PhysRange::new(Pfn::new(2), Pfn::new(1)), None);
}

#[test]
fn boot_accepts_ranges_in_any_order() {
    // Firmware does not promise sorted memory maps (device-tree memory nodes come in tree
    // order). Node 1's zone takes its base from the first range it sees, rounded down to 1 GiB,
    // and refuses a later range below it.
    let w = World::standard();
    let lower = MemoryRange {
        node: n(1),
        range: range(2 * G4, 2 * G4 + 4096),
    };
    let upper = MemoryRange {
        node: n(1),
        range: range(2 * G4 + (1 << 18), 2 * G4 + (1 << 18) + 4096),
    };
    assert_eq!(boot_error(&[w.spec.ranges[0], lower, upper]), None);
    assert_eq!(boot_error(&[w.spec.ranges[0], upper, lower]), None);
}

#[test]
fn bad_hot_adds_are_refused_and_change_nothing() {
    let w = World::standard();
    let m = w.boot();
    let opts = FallbackOptions::default();
    let [r0, r1] = [w.spec.ranges[0].range, w.spec.ranges[1].range];
    for (node, bad, want) in [
        (
            n(2),
            range(5 * G4, 5 * G4),
            BootError::BadRange {
                start: Pfn::new(5 * G4),
            },
        ),
        (
            n(2),
            range((1 << 52) - 16, (1 << 52) + 16),
            BootError::BadRange {
                start: Pfn::new((1 << 52) - 16),
            },
        ),
        (n(2), r0, BootError::Overlap { start: r0.start() }),
        (n(0), r1, BootError::Overlap { start: r1.start() }),
        (
            n(1),
            range(r1.start().get() + 10, r1.start().get() + 20),
            BootError::Overlap {
                start: Pfn::new(r1.start().get() + 10),
            },
        ),
        (
            n(2),
            range(r0.start().get() - 100, r0.start().get() + 1),
            BootError::Overlap {
                start: Pfn::new(r0.start().get() - 100),
            },
        ),
    ] {
        assert_eq!(
            unchanged(&m, || m.hot_add(&w.mem, node, bad, opts)),
            Err(want)
        );
    }
    // Too small for its own metadata.
    let e = unchanged(&m, || {
        m.hot_add(&w.mem, n(2), range(5 * G4, 5 * G4 + 1), opts)
    });
    assert_eq!(
        e,
        Err(BootError::BadRange {
            start: Pfn::new(5 * G4)
        })
    );
    // Memory the platform cannot map: beyond the simulated 64 GiB.
    let e = unchanged(&m, || {
        m.hot_add(&w.mem, n(2), range(20 * G4, 20 * G4 + 4096), opts)
    });
    assert!(matches!(e, Err(BootError::MapFailed { .. })), "{e:?}");
    // No hotplug slot left.
    let w2 = World::standard();
    let full = w2.boot_with(BootOptions {
        hotplug_slots: 0,
        min_free_kbytes: Some(0),
        ..BootOptions::default()
    });
    assert_eq!(
        unchanged(&full, || full.hot_add(
            &w2.mem,
            n(2),
            range(5 * G4, 5 * G4 + 4096),
            opts
        )),
        Err(BootError::TooManyRanges)
    );
    // A good one still works afterwards.
    m.hot_add(&w.mem, n(2), range(5 * G4, 5 * G4 + 4096), opts)
        .unwrap();
    m.check_invariants().unwrap();
    assert!(m.alloc(n(2), Order::ZERO, AllocFlags::THISNODE).is_some());
}

/// A zone holds `MAX_SPANS_PER_ZONE` spans: one more range in it, at boot or by hot-add, is
/// `TooManyRanges` ("more ranges than a zone holds", "no slot left"), not `BadRange`, whose
/// causes (empty, past 2^52 frames, 2^36 frames or more, too small) none of these ranges has.
#[test]
fn a_range_past_a_full_zone_is_too_many_ranges() {
    let w = World::standard();
    let r0 = w.spec.ranges[0];
    // Ranges of 4096 frames on node 1, 8192 frames apart, all above 4 GiB: one zone.
    let on1 = |i: u64| MemoryRange {
        node: n(1),
        range: range(2 * G4 + i * 8192, 2 * G4 + i * 8192 + 4096),
    };
    let mut layout = vec![r0];
    layout.extend((0..=MAX_SPANS_PER_ZONE as u64).map(on1));
    assert_eq!(boot_error(&layout), Some(BootError::TooManyRanges));
    // Exactly a zone's worth boots.
    assert_eq!(boot_error(&layout[..=MAX_SPANS_PER_ZONE]), None);
    // Node 1 boots with one span; hot-adds fill its zone, and the next is refused.
    let m = w.boot();
    let opts = FallbackOptions::default();
    for i in 1..MAX_SPANS_PER_ZONE as u64 {
        m.hot_add(&w.mem, n(1), on1(i).range, opts).unwrap();
    }
    let next = on1(MAX_SPANS_PER_ZONE as u64).range;
    assert_eq!(
        unchanged(&m, || m.hot_add(&w.mem, n(1), next, opts)),
        Err(BootError::TooManyRanges)
    );
}

#[test]
fn hot_add_refuses_memory_the_machine_already_has() {
    // The overlap check looks at the frames the allocator hands out, not at the whole ranges
    // it was given: the metadata carved from the end of each range (and the machine-wide
    // tables) can be hot-added again. Their frames are then handed out, and a guest writing
    // them corrupts the allocator (`check_invariants` then fails with `BadFreeTag`).
    let w = World::new(Spec {
        ranges: vec![memory_range(0, 0, 4096), memory_range(1, G4, G4 + 4096)],
        ..standard()
    });
    let m = w.boot();
    // Node 0's own frames end before 4093; 4093..4096 hold its metadata and the tables.
    assert_eq!(m.node_of(Pfn::new(4093)), None);
    let tail = range(4093, 8192);
    let r = unchanged(&m, || {
        m.hot_add(&w.mem, n(2), tail, FallbackOptions::default())
    });
    assert_eq!(
        r,
        Err(BootError::Overlap {
            start: tail.start()
        })
    );
    // Nor the frames of any table boot carved, machine-wide, per node or per CPU.
    for place in table_places(&m) {
        let r = unchanged(&m, || {
            m.hot_add(&w.mem, n(2), place.frames, FallbackOptions::default())
        });
        assert_eq!(
            r,
            Err(BootError::Overlap {
                start: place.frames.start()
            }),
            "{place:?}"
        );
    }
}

#[test]
fn hot_add_is_atomic_when_the_platform_cannot_map_the_second_piece() {
    // A range straddling 4 GiB is added as two pieces (Dma32, then Normal), each with its
    // metadata at its own end. Here the platform maps only below 4 GiB: the second piece
    // fails with MapFailed after the first was added (and without a zonelist rebuild).
    let w = World {
        spec: Spec {
            ranges: vec![memory_range(0, 0, 4096), memory_range(1, 8192, 16384)],
            ..standard()
        },
        mem: SimMemory::new(&[(0, 4 << 30)]).unwrap(),
    };
    let m = w.boot();
    let straddle = range(G4 - 4096, G4 + 4096);
    let r = unchanged(&m, || {
        m.hot_add(&w.mem, n(2), straddle, FallbackOptions::default())
    });
    assert!(matches!(r, Err(BootError::MapFailed { .. })), "{r:?}");
    // The failed call gave back the first piece's mapping: a platform may refuse a range
    // mapped twice (`SimMemory` does), so a hot-add of that piece alone, with the same
    // metadata region, once failed with MapFailed for good.
    m.hot_add(
        &w.mem,
        n(2),
        range(G4 - 4096, G4),
        FallbackOptions::default(),
    )
    .expect("a hot-add the platform can map");
    m.check_invariants().unwrap();
    assert!(m.alloc(n(2), Order::ZERO, AllocFlags::THISNODE).is_some());
}

/// The machine's own `PhysMemory` must map hot-added memory too (its metadata pool maps slabs
/// of the new frames through it): a hot-add whose memory only the `mem` of the call maps is
/// refused with `MapFailed`, changing nothing. Before, it was taken, and once the new span's
/// seed was used up every allocation there failed with nearly all of it free.
#[test]
fn a_hot_add_the_machines_memory_cannot_map_is_refused() {
    let w = World::standard();
    let m = w.boot();
    let base = 64u64 << 18;
    let own = SimMemory::new(&[(base << 12, 1 << 30)]).unwrap();
    let r = unchanged(&m, || {
        m.hot_add(
            &own,
            n(2),
            range(base, base + 4096),
            FallbackOptions::default(),
        )
    });
    assert!(matches!(r, Err(BootError::MapFailed { .. })), "{r:?}");
    // Through the call's memory, the range is still free to map: a machine whose own memory
    // maps it too takes it.
    m.hot_add(
        &own,
        n(2),
        range(base, base + 4096),
        FallbackOptions::default(),
    )
    .expect_err("still refused");
    let both = World {
        mem: SimMemory::new(&[(0, 65 << 30)]).unwrap(),
        ..World::standard()
    };
    let m2 = both.boot();
    m2.hot_add(
        &both.mem,
        n(2),
        range(base, base + 4096),
        FallbackOptions::default(),
    )
    .unwrap();
    m2.check_invariants().unwrap();
}

/// Adjacent spans leave in one call even when one holds the other's metadata: here planes of
/// `b`'s pageblocks lie in `a`'s seed, and node 2 has no other memory to move them to. Once
/// this failed with `NoMetadata` on every try, though each span could leave alone.
#[test]
fn adjacent_spans_holding_each_others_metadata_go_offline_together() {
    let w = World::standard();
    let m = w.boot();
    let hot = FallbackOptions::default();
    let x = 5 * G4 + 100;
    let (a, b) = (range(x, x + 2000), range(x + 2000, x + 5000));
    m.hot_add(&w.mem, n(2), b, hot).unwrap();
    m.hot_add(&w.mem, n(2), a, hot).unwrap();
    let before = Snap::of(&m);
    assert!(churn_node2(&m, |_| false).is_empty());
    let node = m.node(n(2)).unwrap();
    assert_eq!(
        node.free_pages(),
        node.managed_pages(),
        "every frame is free"
    );
    m.offline(&w.mem, range(x, x + 5000), OfflineOptions::default())
        .unwrap();
    m.check_invariants().unwrap();
    assert_eq!(node.managed_pages(), 0);
    m.hot_add(&w.mem, n(2), b, hot).unwrap();
    m.hot_add(&w.mem, n(2), a, hot).unwrap();
    assert_eq!(Snap::of(&m), before);
    m.check_invariants().unwrap();
}

/// Every block node 2 has, of order 1 and then 0, and all of it freed again but the frames
/// `keep` names: the pageblocks split on the way, and their planes come from wherever the
/// pool had room. Returns the frames kept.
fn churn_node2(m: &Machine<'_>, keep: impl Fn(Pfn) -> bool) -> Vec<Pfn> {
    let mut held = Vec::new();
    for order in [Order::new(1), Order::ZERO] {
        while let Some(p) = m.alloc(n(2), order, AllocFlags::THISNODE) {
            held.push((p, order));
        }
    }
    let mut kept = Vec::new();
    for (p, order) in held {
        if order == Order::ZERO && kept.is_empty() && keep(p) {
            kept.push(p);
        } else {
            m.free(p, order).unwrap();
        }
    }
    kept
}

/// Three adjacent spans whose seeds and slabs hold each other's planes leave in one call with
/// no other memory in the node; the memory they left with is then overwritten (it went back
/// to the platform), and the spans come back as they were.
#[test]
fn three_adjacent_spans_holding_each_others_metadata_go_offline_together() {
    let w = World::standard();
    let m = w.boot();
    let hot = FallbackOptions::default();
    let x = 5 * G4 + 100;
    // Large enough that the pool grows into the spans' frames too.
    let spans = [
        range(x, x + 40_000),
        range(x + 40_000, x + 90_000),
        range(x + 90_000, x + 130_000),
    ];
    for r in spans.iter().rev() {
        m.hot_add(&w.mem, n(2), *r, hot).unwrap();
    }
    // The last span leaves and comes back: it takes the first slot again, and its seed is now
    // the newest, which serves planes first. So the span of the first slot holds planes of the
    // later ones: removing the spans one by one in slot order (each giving its own metadata
    // back, then leaving) would find it still in use.
    let last = spans[2];
    m.offline(&w.mem, last, OfflineOptions::default()).unwrap();
    m.hot_add(&w.mem, n(2), last, hot).unwrap();
    let before = Snap::of(&m);
    assert!(churn_node2(&m, |_| false).is_empty());
    m.check_invariants().unwrap();
    let node = m.node(n(2)).unwrap();
    let all = range(x, x + 130_000);
    m.offline(&w.mem, all, OfflineOptions::default()).unwrap();
    m.check_invariants().unwrap();
    assert_eq!(node.managed_pages(), 0);
    assert_eq!(node.free_pages(), 0);
    // SAFETY: the range left the machine: nothing of it is the allocator's any more.
    unsafe { w.mem.fill(all, 0xee) };
    m.check_invariants().unwrap();
    // SAFETY: as above.
    unsafe { w.mem.fill(all, 0) };
    for r in spans.iter().rev() {
        m.hot_add(&w.mem, n(2), *r, hot).unwrap();
    }
    assert_eq!(Snap::of(&m), before);
    m.check_invariants().unwrap();
}

/// Two spans of a zone leave together while a third of that zone, kept isolated by an earlier
/// failed offline, stays: its planes lying in their memory must move out first (with no memory
/// in service the offline is refused for want of metadata), and once a fourth span gives the
/// pool room they do, the two leave, and the memory they left with is overwritten. The third
/// span then works on, and leaves in its turn.
#[test]
fn spans_leave_together_while_a_span_kept_isolated_stays() {
    let w = World::standard();
    let m = w.boot();
    let hot = FallbackOptions::default();
    let x = 5 * G4 + 100;
    let (a, b, c) = (
        range(x, x + 2000),
        range(x + 2000, x + 5000),
        range(x + 5000, x + 7000),
    );
    let d = range(x + 9000, x + 12000);
    for r in [c, b, a] {
        m.hot_add(&w.mem, n(2), r, hot).unwrap();
    }
    // One frame of `c` stays handed out, so an offline of `c` keeping it isolated fails.
    let busy = churn_node2(&m, |p| c.contains(p));
    assert_eq!(busy.len(), 1);
    let kept = OfflineOptions {
        keep_isolated: true,
        ..OfflineOptions::default()
    };
    assert!(matches!(
        m.offline(&w.mem, c, kept),
        Err(OfflineError::Busy { busy: 1, .. })
    ));
    m.check_invariants().unwrap();
    let ab = range(x, x + 5000);
    // Nowhere in service to move `c`'s metadata to: `a` and `b` stay, and usable.
    assert!(
        matches!(
            m.offline(&w.mem, ab, OfflineOptions::default()),
            Err(OfflineError::NoMetadata { .. })
        ),
        "some of `c`'s metadata lies in `a` or `b`"
    );
    m.check_invariants().unwrap();
    m.hot_add(&w.mem, n(2), d, hot).unwrap();
    m.offline(&w.mem, ab, OfflineOptions::default()).unwrap();
    m.check_invariants().unwrap();
    // SAFETY: the range left the machine: nothing of it is the allocator's any more.
    unsafe { w.mem.fill(ab, 0xee) };
    m.check_invariants().unwrap();
    // `c` is still isolated: nothing is allocated from it until it is given back.
    let node = m.node(n(2)).unwrap();
    let held: Vec<Pfn> =
        core::iter::from_fn(|| m.alloc(n(2), Order::ZERO, AllocFlags::THISNODE)).collect();
    assert!(held.iter().all(|p| d.contains(*p)));
    m.free_bulk(&held).unwrap();
    m.free(busy[0], Order::ZERO).unwrap();
    m.unisolate(c).unwrap();
    m.check_invariants().unwrap();
    assert!(churn_node2(&m, |_| false).is_empty());
    assert_eq!(node.free_pages(), node.managed_pages());
    m.check_invariants().unwrap();
    m.offline(&w.mem, c, OfflineOptions::default()).unwrap();
    m.offline(&w.mem, d, OfflineOptions::default()).unwrap();
    m.check_invariants().unwrap();
    assert_eq!(node.managed_pages(), 0);
}

/// A refused offline (`Busy`) keeps what its isolation did, as Linux's failed offlining does:
/// the pageblocks of the range that per-CPU caches held are back in the buddy. Nothing else
/// changes: free memory (free + cached) is the same, the frames handed out stay so, and the
/// range serves allocations again.
#[test]
fn a_busy_offline_gives_back_cached_pageblocks_and_changes_nothing_else() {
    let w = World::standard();
    let m = w.boot();
    let node0 = m.node(n(0)).unwrap();
    let mut boot_frames = Vec::new();
    while let Some(p) = m.alloc(n(0), Order::ZERO, AllocFlags::THISNODE) {
        boot_frames.push(p);
    }
    let a = range(5 * G4, 5 * G4 + 4096);
    m.hot_add(&w.mem, n(0), a, FallbackOptions::default())
        .unwrap();
    let busy = m.alloc(n(0), Order::ZERO, AllocFlags::THISNODE).unwrap();
    let cpu = m.cpu(0).unwrap();
    let p = m.alloc_cpu(cpu, Order::ZERO, AllocFlags::THISNODE).unwrap();
    assert!(a.contains(busy) && a.contains(p));
    let cached = m.cached_pages();
    assert!(cached > 0, "CPU 0 holds a pageblock of the range");
    let free = node0.free_pages();
    assert!(matches!(
        m.offline(&w.mem, a, OfflineOptions::default()),
        Err(OfflineError::Busy { .. })
    ));
    m.check_invariants().unwrap();
    assert_eq!(m.cached_pages(), 0);
    assert_eq!(node0.free_pages(), free + cached);
    for q in [busy, p] {
        assert_eq!(m.free(q, Order::ZERO), Ok(()), "{q:?} stayed handed out");
    }
    let again = m.alloc(n(0), Order::ZERO, AllocFlags::THISNODE).unwrap();
    assert!(a.contains(again), "the range serves allocations again");
    m.free(again, Order::ZERO).unwrap();
    m.free_bulk(&boot_frames).unwrap();
    m.check_invariants().unwrap();
}

/// Offlining works on whole spans (the zone parts of boot and hot-added ranges). Every other
/// range is refused with a typed error, nothing changed: empty, foreign (wholly or in part),
/// partial (a boundary inside a range, aligned or not), overlapping two ranges, and ranges
/// that boot carved tables from (the machine's, a node's, a CPU's). `unisolate` refuses the
/// same, and ranges that are not isolated.
#[test]
fn bad_offlines_are_refused_and_change_nothing() {
    let w = World::standard();
    let m = w.boot();
    let hot = FallbackOptions::default();
    // Two adjacent hot-added ranges, and a frame in use in the first (it stays in use).
    let (a, b) = (
        range(5 * G4, 5 * G4 + 4096),
        range(5 * G4 + 4096, 5 * G4 + 8192),
    );
    m.hot_add(&w.mem, n(2), a, hot).unwrap();
    m.hot_add(&w.mem, n(2), b, hot).unwrap();
    let held = m.alloc(n(2), Order::ZERO, AllocFlags::THISNODE).unwrap();
    let [r0, r1] = [w.spec.ranges[0].range, w.spec.ranges[1].range];
    let at = |p: u64| Pfn::new(p);
    let opts = OfflineOptions::default();
    let cases = [
        (range(5 * G4, 5 * G4), OfflineError::Empty),
        (
            range(9 * G4, 9 * G4 + 512),
            OfflineError::Foreign { pfn: at(9 * G4) },
        ),
        (
            range(a.start().get() - 512, a.end().get()),
            OfflineError::Foreign {
                pfn: at(a.start().get() - 512),
            },
        ),
        (
            range(b.start().get(), b.end().get() + 1),
            OfflineError::Foreign { pfn: b.end() },
        ),
        (
            range(a.start().get(), a.end().get() - 512),
            OfflineError::Partial {
                pfn: at(a.end().get() - 512),
            },
        ),
        // Unaligned: a boundary that is not even on a pageblock.
        (
            range(a.start().get() + 3, a.end().get()),
            OfflineError::Partial {
                pfn: at(a.start().get() + 3),
            },
        ),
        (
            range(a.start().get(), a.end().get() - 7),
            OfflineError::Partial {
                pfn: at(a.end().get() - 7),
            },
        ),
        // Overlapping two ranges: the end of `a` and the start of `b`.
        (
            range(a.start().get() + 2048, b.start().get() + 2048),
            OfflineError::Partial {
                pfn: at(a.start().get() + 2048),
            },
        ),
        // The Dma32 half of node 0's range holds the machine's tables; node 1's range holds
        // node 1's own tables and its CPUs' (each node's come from its own memory).
        (r0, OfflineError::Tables { start: r0.start() }),
        (
            range(r0.start().get(), G4),
            OfflineError::Tables { start: r0.start() },
        ),
        (r1, OfflineError::Tables { start: r1.start() }),
    ];
    for (bad, want) in cases {
        assert_eq!(
            unchanged(&m, || m.offline(&w.mem, bad, opts)),
            Err(want),
            "{bad:?}"
        );
        let keep = OfflineOptions {
            keep_isolated: true,
            ..opts
        };
        assert_eq!(
            unchanged(&m, || m.offline(&w.mem, bad, keep)),
            Err(want),
            "{bad:?}"
        );
        assert_eq!(unchanged(&m, || m.unisolate(bad)), Err(want), "{bad:?}");
    }
    assert_eq!(
        unchanged(&m, || m.unisolate(a)),
        Err(OfflineError::NotIsolated { pfn: a.start() })
    );
    // A range in use is refused with the count and the first frame in use; nothing changed.
    assert_eq!(
        unchanged(&m, || m.offline(
            &w.mem,
            range(a.start().get(), b.end().get()),
            opts
        )),
        Err(OfflineError::Busy { busy: 1, pfn: held })
    );
    // `a` and `b` together are whole spans; the Normal half of node 0's range is one too, but
    // node 0's own tables live there (its largest piece), so it stays.
    m.free(held, Order::ZERO).unwrap();
    m.offline(&w.mem, range(a.start().get(), b.end().get()), opts)
        .unwrap();
    assert_eq!(
        unchanged(&m, || m.offline(&w.mem, range(G4, r0.end().get()), opts)),
        Err(OfflineError::Tables { start: at(G4) })
    );
    m.check_invariants().unwrap();
    assert_eq!(m.node(n(2)).unwrap().managed_pages(), 0);
}

#[test]
fn huge_hotplug_slot_counts_are_a_typed_error() {
    let w = World::standard();
    let r = Machine::boot(
        w.spec.topology(),
        &w.mem,
        &w.spec.ranges,
        BootOptions {
            hotplug_slots: usize::MAX,
            ..BootOptions::default()
        },
    );
    assert_eq!(r.unwrap_err(), BootError::NoBootMemory);
}

/// Slot counts anywhere near `usize::MAX`, not only `usize::MAX` itself: the table sizing must
/// not overflow (the gate runs this suite with overflow checks on as well).
#[test]
fn hotplug_slot_counts_near_usize_max_are_a_typed_error() {
    let w = World::standard();
    for slots in [
        usize::MAX - 1,
        usize::MAX / 2,
        usize::MAX / 3,
        usize::MAX / 64,
        usize::MAX >> 20,
        1 << 40,
    ] {
        let r = Machine::boot(
            w.spec.topology(),
            &w.mem,
            &w.spec.ranges,
            BootOptions {
                hotplug_slots: slots,
                ..BootOptions::default()
            },
        );
        assert_eq!(r.unwrap_err(), BootError::NoBootMemory, "{slots} slots");
    }
}

/// A platform that breaks `PhysMemory`'s alignment promise gets a typed boot error, not
/// misaligned tables.
#[test]
fn misaligned_platform_memory_is_refused() {
    /// Memory for every mapping from the heap, 8 bytes past a page boundary.
    struct Misaligned;
    // SAFETY: every mapping gets a fresh, leaked buffer of the range's size (plus the offset),
    // valid for the program's lifetime and used by nothing else; only the alignment promise is
    // broken, which is what the allocator must refuse.
    unsafe impl numaframe::PhysMemory for Misaligned {
        fn map(&self, range: PhysRange) -> Option<std::ptr::NonNull<u8>> {
            let bytes = usize::try_from(range.bytes()).ok()? + 8;
            let layout = std::alloc::Layout::from_size_align(bytes, 4096).ok()?;
            // SAFETY: the layout is not empty.
            let p = unsafe { std::alloc::alloc_zeroed(layout) };
            // SAFETY: the buffer holds `range.bytes() + 8` bytes, so 8 bytes in stays inside.
            std::ptr::NonNull::new(p).map(|p| unsafe { p.add(8) })
        }
    }
    let w = World::standard();
    let mem = Misaligned;
    let r = Machine::boot(
        w.spec.topology(),
        &mem,
        &w.spec.ranges,
        BootOptions::default(),
    );
    assert!(
        matches!(r, Err(BootError::MapFailed { .. })),
        "boot over misaligned memory: {:?}",
        r.map(|_| ())
    );
}

#[test]
fn extreme_tuning_is_clamped_or_refused() {
    let w = World::standard();
    // Watermarks above all memory: only reserve allocations succeed.
    let m = w.boot_with(BootOptions {
        cpus: &w.spec.cpus,
        min_free_kbytes: Some(u64::MAX),
        pcp: PcpConfig {
            batch: u32::MAX,
            high: u32::MAX,
        },
        ..BootOptions::default()
    });
    assert_eq!(m.alloc(n(0), Order::ZERO, AllocFlags::empty()), None);
    let c = m.cpu(0).unwrap();
    assert_eq!(m.alloc_cpu(c, Order::ZERO, AllocFlags::empty()), None);
    let p = m.alloc(n(0), Order::ZERO, AllocFlags::RESERVE).unwrap();
    assert_eq!(m.reserve_huge(n(1), HugeSize::Size2M, u64::MAX), 0);
    m.free(p, Order::ZERO).unwrap();
    // Caches of every shape.
    let w = World::standard();
    let m = w.boot();
    let c = m.cpu(0).unwrap();
    for (batch, high) in [
        (0, 0),
        (0, 1),
        (1, u32::MAX),
        (u32::MAX, 0),
        (u32::MAX, u32::MAX),
    ] {
        m.set_pcp(PcpConfig { batch, high });
        let got = m.pcp();
        assert!((1..=numaframe::percpu::MAX_BATCH).contains(&got.batch));
        assert!(got.high == 0 || got.high >= got.batch);
        let p = m.alloc_cpu(c, Order::ZERO, AllocFlags::empty()).unwrap();
        m.free_cpu(c, p, Order::ZERO).unwrap();
        m.check_invariants().unwrap();
    }
    // Counts of u64::MAX.
    let got = m.reserve_huge(n(1), HugeSize::Size2M, u64::MAX);
    assert!(got > 0);
    assert_eq!(m.release_huge(n(1), HugeSize::Size2M, u64::MAX), got);
    // Empty slices.
    m.drain_all();
    let before = Snap::of(&m);
    assert_eq!(m.alloc_bulk(n(0), AllocFlags::empty(), &mut []), 0);
    m.free_bulk(&[]).unwrap();
    let mut task =
        TaskPolicy::new(&m, Policy::WeightedInterleave(NodeMask::first_n(2)), true).unwrap();
    assert_eq!(
        task.alloc_bulk(&m, n(0), AllocFlags::empty(), &mut [])
            .placed,
        0
    );
    m.drain_all();
    assert_eq!(Snap::of(&m), before);
    // Interleave cursors from anywhere, bulks of any size.
    let mask = NodeMask::first_n(2);
    let weights = Weights::new(&[255, 1]).unwrap();
    for (prev, left) in [(0, 255), (1, 255), (1023, 0), (1023, 255), (5, 7)] {
        let mut il = IlState::from_raw(n(prev), left);
        let mut total = 0u64;
        plan_bulk(&mut il, &mask, &weights, u64::MAX, |node, count| {
            assert!(mask.contains(node));
            total += count;
        });
        assert_eq!(total, u64::MAX);
        task.set_il_state(IlState::from_raw(n(prev), left));
        let mut out = [Pfn::new(0); 3];
        let r = task.alloc_bulk(&m, n(0), AllocFlags::empty(), &mut out);
        m.free_bulk(&out[..r.placed]).unwrap();
    }
    m.drain_all();
    m.check_invariants().unwrap();
}

#[test]
fn hugepage_command_lines_never_panic_and_point_inside() {
    for line in [
        "",
        "=",
        "\"",
        "\"\"",
        "hugepages",
        "hugepages=",
        "hugepagesz=",
        "default_hugepagesz=",
        "hugepagesz=0",
        "hugepagesz=2MB",
        "hugepagesz=18446744073709551616",
        "hugepagesz=99999999999999999999999G",
        "hugepagesz=0x",
        "hugepagesz=1E",
        "hugepages=18446744073709551616",
        "hugepages=0:18446744073709551615,1:1",
        "hugepages=1023:1",
        "hugepages=1024:1",
        "hugepages=99999999999999999999:1",
        "hugepages=:",
        "hugepages=0:",
        "hugepages=,",
        "hugepages=0:1,",
        "hugepages=0:1,0:1",
        "hugepages=é",
        "hugepages=0:1,é:2",
        "hugepagesz=2M hugepagesz=2M",
        "default_hugepagesz=1G default_hugepagesz=1G",
        "hugepages=1 hugepages=2",
        "hugepagesz=1G\u{a0}hugepages=1",
        "\"hugepages=1",
        "hugepages=\"0:1,1:2",
        "-- hugepages=",
    ] {
        match cmdline::parse(line) {
            Ok(cfg) => {
                for nodes in [0, 1, MAX_NODES] {
                    if let Err(e) = cfg.validate_nodes(nodes) {
                        assert!(e.offset < line.len() && line.is_char_boundary(e.offset));
                    }
                }
            }
            Err(e) => assert!(
                e.offset < line.len() && line.is_char_boundary(e.offset),
                "{line:?}: {e}"
            ),
        }
    }
    let many: String = (0..65).map(|i| format!("{i}:1,")).collect();
    let line = format!("hugepages={}", many.trim_end_matches(','));
    let e = cmdline::parse(&line).unwrap_err();
    assert_eq!(e.kind, cmdline::CmdlineErrorKind::TooManyNodeEntries);
    assert!(e.offset < line.len());
}

#[test]
fn topology_readers_refuse_hostile_text() {
    let big_distances: String = {
        let row = format!("[{}]", vec!["10"; 1025].join(","));
        format!("distances = [{}]\n", vec![row; 1025].join(","))
    };
    for text in [
        "",
        "\0",
        "distances = [[10]]",
        "distances = [[10]]\n[[node]]\nid = 1\nmemory = \"1G\"\n",
        "distances = [[10]]\n[[node]]\nid = 0\nmemory = \"1Q\"\n",
        "distances = [[10]]\n[[node]]\nid = 0\nmemory = \"18446744073709551616\"\n",
        "distances = [[11]]\n[[node]]\nid = 0\nmemory = \"1G\"\n",
        "distances = [[10, 20]]\n[[node]]\nid = 0\nmemory = \"1G\"\n",
        "distances = [[10]]\n[[node]]\nid = 0\nmemory = \"1G\"\ncpus = \"0-99999999\"\n",
        "distances = [[10]]\n[[node]]\nid = 0\nmemory = \"1G\"\ninitiator = 0\n",
        "distances = [[10]]\n[[node]]\nid = 0\nmemory = \"4097\"\n",
        big_distances.as_str(),
    ] {
        let e = parse_toml(text).unwrap_err();
        assert!(!e.to_string().contains('\n'), "{e}");
    }
    for text in [
        "",
        "available: 0 nodes ()",
        "available: 1025 nodes (0-1024)",
        "available: 1 nodes (0)\nnode 0 cpus: 0\nnode 0 size: 99999999999999999999 MB\n",
        "available: 2 nodes (0,2)\n",
        "available: 1 nodes (0)\nnode 0 cpus: 0\nnode 0 size: 1024 MB\nnode distances:\nnode 0\n0: 9\n",
        "available: 1 nodes (0)\nnode 0 cpus: 0\nnode 0 size: 1024 MB\nnode distances:\nnode 0\n0: 10 20\n",
    ] {
        let e = parse_numactl(text).unwrap_err();
        assert!(!e.to_string().contains('\n'), "{e}");
    }
}

#[test]
fn hugepage_reservation_of_any_size_never_over_reserves() {
    use numaframe::hugetlb::ReservationPlan;
    let w = World::standard();
    let m = w.boot();
    // Node lists naming nodes the machine lacks are refused with the entry's offset.
    let cfg = cmdline::parse("hugepages=0:1,7:1").unwrap();
    let e = ReservationPlan::new(&cfg, &m).unwrap_err();
    assert_eq!(e.kind, cmdline::CmdlineErrorKind::UnknownNode);
    assert_eq!(e.offset, "hugepages=0:1,".len());
    // Counts up to u64::MAX, with chunks of 0 (taken as 1) and u64::MAX pages.
    for (line, chunk) in [
        ("hugepages=18446744073709551615", 0),
        ("hugepages=0:18446744073709551614,1:1", u64::MAX),
        (
            "hugepagesz=1G hugepages=18446744073709551615 hugepagesz=2M hugepages=2:5",
            1,
        ),
    ] {
        let w = World::standard();
        let m = w.boot();
        let cfg = cmdline::parse(line).unwrap();
        let mut plan = ReservationPlan::with_chunk_pages(&cfg, &m, chunk).unwrap();
        plan.run(&m);
        m.check_invariants().unwrap();
        for size in HugeSize::ALL {
            let total: u64 = (0..3).map(|i| m.huge_counts(n(i), size).total).sum();
            assert!(total <= cfg.total(size));
        }
        assert!(plan.report(&m).to_string().ends_with('\n'));
    }
    // A plan made for a bigger machine, run on this one: the nodes it lacks get nothing.
    let big = World::new(Spec {
        cpus: vec![],
        ..standard()
    });
    let mb = big.boot();
    let cfg = cmdline::parse("hugepages=0:2,1:2,2:2").unwrap();
    let mut plan = ReservationPlan::new(&cfg, &mb).unwrap();
    let small = World {
        spec: Spec::uniform(1, 4096, 0),
        mem: SimMemory::new(&[(0, 64 << 20)]).unwrap(),
    };
    let ms = small.boot();
    plan.run(&ms);
    ms.check_invariants().unwrap();
    assert!(ms.huge_counts(n(0), HugeSize::Size2M).total <= 2);
    let _ = plan.report(&ms).to_string();
}
