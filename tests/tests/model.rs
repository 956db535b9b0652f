//! Model-based property test: random operation sequences against a trivially correct
//! reference (a map of handed-out blocks), through the public API only.

use std::collections::BTreeMap;

use numaframe::{AllocFlags, FreeError, Machine, NodeId, Order, PAGE_SIZE, Pfn};
use numaframe_hosted::sim::SimMemory;
use numaframe_testkit::Spec;
use proptest::prelude::*;

const NODES: usize = 2;
/// Node sizes that are not powers of two, and a base that is not 1 GiB aligned.
const NODE_BYTES: [u64; NODES] = [3 << 20, (5 << 20) + (12 << 12)];
const BASE: u64 = (1 << 32) - (2 << 20);

#[derive(Clone, Debug)]
enum Op {
    Alloc { node: usize, order: u8 },
    Free { pick: usize },
    Bulk { node: usize, n: usize },
    FreeBulk { pick: usize, n: usize },
    BadFree { pick: usize, kind: u8 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..NODES, 0u8..=10).prop_map(|(node, order)| Op::Alloc { node, order }),
        3 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        2 => (0..NODES, 0usize..700).prop_map(|(node, n)| Op::Bulk { node, n }),
        2 => (any::<usize>(), 0usize..600).prop_map(|(pick, n)| Op::FreeBulk { pick, n }),
        1 => (any::<usize>(), 0u8..4).prop_map(|(pick, kind)| Op::BadFree { pick, kind }),
    ]
}

/// The machine's tables over simulated memory of exactly its ranges.
struct World {
    spec: Spec,
    mem: SimMemory,
}

fn world() -> World {
    let spec = Spec::back_to_back(&NODE_BYTES.map(|b| b / PAGE_SIZE), BASE / PAGE_SIZE);
    let arenas: Vec<(u64, u64)> = spec
        .ranges
        .iter()
        .map(|r| (r.range.start().addr().get(), r.range.bytes()))
        .collect();
    World {
        mem: SimMemory::new(&arenas).unwrap(),
        spec,
    }
}

fn free_pages(m: &Machine<'_>) -> u64 {
    m.nodes().iter().map(|n| n.free_pages()).sum()
}

/// Checks that the reference's blocks are disjoint, inside managed memory, and that
/// free + allocated == total.
fn check(m: &Machine<'_>, live: &BTreeMap<u64, u8>, total: u64) {
    m.check_invariants().unwrap();
    let mut end = 0;
    let mut allocated = 0;
    for (&pfn, &order) in live {
        assert!(pfn >= end, "block at {pfn:#x} overlaps the one before");
        end = pfn + (1 << order);
        allocated += 1u64 << order;
        assert!(m.node_of(Pfn::new(pfn)).is_some());
    }
    assert_eq!(free_pages(m) + allocated, total);
}

fn nth(live: &BTreeMap<u64, u8>, pick: usize) -> Option<(u64, u8)> {
    if live.is_empty() {
        return None;
    }
    live.iter().nth(pick % live.len()).map(|(p, o)| (*p, *o))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_operations_match_the_reference(ops in proptest::collection::vec(op(), 1..120)) {
        let w = world();
        let m = w.spec.boot(&w.mem);
        let total = free_pages(&m);
        let mut live: BTreeMap<u64, u8> = BTreeMap::new();
        for op in ops {
            match op {
                Op::Alloc { node, order } => {
                    let before = free_pages(&m);
                    match m.alloc(NodeId::new(node), Order::new(order), AllocFlags::empty()) {
                        Some(p) => {
                            prop_assert!(p.is_aligned(Order::new(order)));
                            prop_assert!(live.insert(p.get(), order).is_none(), "handed out twice");
                        }
                        // Fragmentation may refuse a high order; an order-0 refusal needs an empty machine.
                        None => prop_assert!(order > 0 || before == 0, "order-0 failure with {} pages free", before),
                    }
                }
                Op::Free { pick } => {
                    if let Some((p, o)) = nth(&live, pick) {
                        m.free(Pfn::new(p), Order::new(o)).unwrap();
                        live.remove(&p);
                    }
                }
                Op::Bulk { node, n } => {
                    let mut out = vec![Pfn::new(0); n];
                    let before = free_pages(&m);
                    let got = m.alloc_bulk(NodeId::new(node), AllocFlags::empty(), &mut out);
                    prop_assert_eq!(got as u64, (n as u64).min(before), "bulk is short only when memory runs out");
                    for p in &out[..got] {
                        prop_assert!(live.insert(p.get(), 0).is_none(), "bulk handed out a frame twice");
                    }
                }
                Op::FreeBulk { pick, n } => {
                    let singles: Vec<u64> = live.iter().filter(|(_, o)| **o == 0).map(|(p, _)| *p).collect();
                    if !singles.is_empty() {
                        let start = pick % singles.len();
                        let take: Vec<Pfn> = singles[start..].iter().take(n).map(|p| Pfn::new(*p)).collect();
                        m.free_bulk(&take).unwrap();
                        for p in take {
                            live.remove(&p.get());
                        }
                    }
                }
                Op::BadFree { pick, kind } => {
                    let before: Vec<_> = m.nodes().iter().map(|n| n.free_pages()).collect();
                    let err = match (nth(&live, pick), kind) {
                        (Some((p, o)), 0) if o < 10 => m.free(Pfn::new(p), Order::new(o + 1)).unwrap_err(),
                        (Some((p, o)), 1) if o > 0 => m.free(Pfn::new(p + 1), Order::ZERO).unwrap_err(),
                        (Some((p, 0)), 2) => m.free_bulk(&[Pfn::new(p), Pfn::new(p)]).unwrap_err().error,
                        _ => m.free(Pfn::new(1 << 45), Order::ZERO).unwrap_err(),
                    };
                    let typed = matches!(err, FreeError::WrongOrder { .. } | FreeError::Misaligned { .. } | FreeError::NotAllocated { .. } | FreeError::Duplicate { .. } | FreeError::Foreign { .. });
                    prop_assert!(typed, "unexpected error {:?}", err);
                    let after: Vec<_> = m.nodes().iter().map(|n| n.free_pages()).collect();
                    prop_assert_eq!(before, after, "a refused free changes nothing");
                }
            }
            check(&m, &live, total);
        }
        for (p, o) in std::mem::take(&mut live) {
            m.free(Pfn::new(p), Order::new(o)).unwrap();
        }
        check(&m, &live, total);
    }
}

/// What one entry of a bulk free is, relative to the reference's blocks.
#[derive(Clone, Copy, Debug)]
enum Entry {
    /// A held order-0 frame (the `n`th, wrapping).
    Held(usize),
    /// The head of a held block of order 1 or more.
    Head(usize),
    /// A frame inside a held block of order 1 or more.
    Inside(usize),
    /// The frame right after a held order-0 frame (free, another block, or not the machine's).
    Next(usize),
}

fn entry() -> impl Strategy<Value = Entry> {
    prop_oneof![
        12 => any::<usize>().prop_map(Entry::Held),
        1 => any::<usize>().prop_map(Entry::Head),
        1 => any::<usize>().prop_map(Entry::Inside),
        1 => any::<usize>().prop_map(Entry::Next),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// A bulk free of held frames with bad entries mixed in (duplicates, heads and insides of
    /// larger blocks, neighbours): refused at the first entry the sequential rule refuses (the
    /// first that is not a held order-0 frame not yet freed earlier in the slice), a duplicate
    /// named as such, with nothing changed; or, with no bad entry, every frame freed.
    #[test]
    fn bulk_frees_stop_at_the_first_bad_entry(
        orders in proptest::collection::vec(prop_oneof![6 => Just(0u8), 1 => 1u8..=4], 1..300),
        entries in proptest::collection::vec(entry(), 1..200),
        sorted in any::<bool>(),
    ) {
        let w = world();
        let m = w.spec.boot(&w.mem);
        let total = free_pages(&m);
        let mut live: BTreeMap<u64, u8> = BTreeMap::new();
        for o in orders {
            if let Some(p) = m.alloc(NodeId::new(0), Order::new(o), AllocFlags::empty()) {
                live.insert(p.get(), o);
            }
        }
        let singles: Vec<u64> = live.iter().filter(|(_, o)| **o == 0).map(|(p, _)| *p).collect();
        let larger: Vec<(u64, u8)> = live.iter().filter(|(_, o)| **o > 0).map(|(p, o)| (*p, *o)).collect();
        let pick = |v: &[u64], n: usize| (!v.is_empty()).then(|| v[n % v.len()]);
        let mut pfns: Vec<u64> = entries
            .iter()
            .filter_map(|e| match *e {
                Entry::Held(n) => pick(&singles, n),
                Entry::Head(n) => (!larger.is_empty()).then(|| larger[n % larger.len()].0),
                Entry::Inside(n) => (!larger.is_empty()).then(|| {
                    let (p, o) = larger[n % larger.len()];
                    p + 1 + (n as u64 >> 8) % ((1 << o) - 1)
                }),
                Entry::Next(n) => pick(&singles, n).map(|p| p + 1),
            })
            .collect();
        if sorted {
            // Runs of one pageblock, as a bulk allocation hands them out (duplicates stay).
            pfns.sort_unstable();
        }
        // The oracle: the sequential rule, entry by entry.
        let mut freed = std::collections::BTreeSet::new();
        let mut first_bad = None;
        for (i, p) in pfns.iter().enumerate() {
            if freed.contains(p) {
                first_bad = Some((i, true));
                break;
            }
            if live.get(p) != Some(&0) {
                first_bad = Some((i, false));
                break;
            }
            freed.insert(*p);
        }
        let slice: Vec<Pfn> = pfns.iter().map(|p| Pfn::new(*p)).collect();
        let before = free_pages(&m);
        match (m.free_bulk(&slice), first_bad) {
            (Ok(()), None) => {
                for p in &pfns {
                    live.remove(p);
                }
            }
            (Err(e), Some((index, duplicate))) => {
                prop_assert_eq!(e.index, index, "{:?}", e);
                prop_assert_eq!(matches!(e.error, FreeError::Duplicate { .. }), duplicate, "{:?}", e);
                prop_assert_eq!(free_pages(&m), before, "a refused bulk free changes nothing");
            }
            (got, want) => prop_assert!(false, "free_bulk gave {:?}, the rule {:?}", got, want),
        }
        check(&m, &live, total);
    }
}
