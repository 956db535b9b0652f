//! Weighted interleave through the public API: the reference vectors in
//! `tests/vectors/interleave.json`, and property tests of the bulk plan against an independent
//! page-by-page model of the rule in docs/interleave.md.

use std::collections::{BTreeMap, BTreeSet};

use numaframe::interleave::{IlState, Weights, plan_bulk};
use numaframe::{MAX_NODES, NodeId, NodeMask};
use proptest::prelude::*;
use serde_json::Value;

/// Runs one bulk and checks the emits: only nodes of the set, none empty, at most one per node.
/// Returns the pages per node.
fn bulk(state: &mut IlState, nodes: &NodeMask, w: &Weights, pages: u64) -> BTreeMap<usize, u64> {
    let mut counts = BTreeMap::new();
    plan_bulk(state, nodes, w, pages, |node, count| {
        assert!(nodes.contains(node), "emit for node {node} outside the set");
        assert!(count > 0, "empty emit for node {node}");
        assert!(
            counts.insert(node.index(), count).is_none(),
            "second emit for node {node}"
        );
    });
    assert!(counts.len() <= nodes.count());
    counts
}

fn as_usize(v: &Value, what: &str) -> usize {
    v.as_u64()
        .and_then(|n| usize::try_from(n).ok())
        .unwrap_or_else(|| panic!("{what}: not a number: {v}"))
}

#[test]
fn reference_vectors() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/vectors/interleave.json");
    let text = std::fs::read_to_string(path).expect("read interleave.json");
    let doc: Value = serde_json::from_str(&text).expect("parse interleave.json");
    let cases = doc["cases"].as_array().expect("cases");
    assert!(!cases.is_empty());
    let mut checked_calls = 0;
    for case in cases {
        let name = case["name"].as_str().expect("name");
        let node_list: Vec<usize> = case["nodes"]
            .as_array()
            .expect("nodes")
            .iter()
            .map(|n| as_usize(n, name))
            .collect();
        let nodes = NodeMask::from_nodes(node_list.iter().map(|&n| NodeId::new(n)));

        let mut table = vec![1u8; node_list.iter().max().map_or(0, |m| m + 1)];
        for (node, w) in case["weights"].as_object().expect("weights") {
            let node: usize = node.parse().expect("weight key");
            let w = u8::try_from(as_usize(w, name)).expect("weight fits u8");
            if node >= table.len() {
                table.resize(node + 1, 1);
            }
            table[node] = w;
        }
        let weights = Weights::new(&table).expect("valid weights");

        let mut state = match &case["initial_state"] {
            Value::Null => IlState::new(),
            s => IlState::from_raw(
                NodeId::new(as_usize(&s["prev"], name)),
                u8::try_from(as_usize(&s["left"], name)).expect("left fits u8"),
            ),
        };

        for (i, call) in case["calls"].as_array().expect("calls").iter().enumerate() {
            let pages = call["pages"].as_u64().expect("pages");
            let got = bulk(&mut state, &nodes, &weights, pages);
            let want = call["counts"].as_object().expect("counts");
            // Every node of the case is listed, zeros included.
            for &n in &node_list {
                let expected = want
                    .get(&n.to_string())
                    .and_then(Value::as_u64)
                    .unwrap_or_else(|| panic!("{name}: call {i}: no count for node {n}"));
                let actual = got.get(&n).copied().unwrap_or(0);
                assert_eq!(actual, expected, "{name}: call {i}: node {n}");
            }
            assert_eq!(want.len(), node_list.len(), "{name}: call {i}: count keys");
            let (node, left) = state.normalised(&nodes, &weights);
            let expected = (
                as_usize(&call["state"]["node"], name),
                as_usize(&call["state"]["left"], name),
            );
            assert_eq!(
                (node.index(), usize::from(left)),
                expected,
                "{name}: call {i}: state"
            );
            checked_calls += 1;
        }
    }
    assert_eq!(checked_calls, 14);
}

/// Nodes the property tests draw from.
const SPAN: usize = 128;

/// Independent model: the single-page rule of docs/interleave.md on a sorted list of node ids.
#[derive(Clone, Copy)]
struct Model<'a> {
    nodes: &'a [usize],
    weights: &'a [u8],
    prev: usize,
    left: u8,
}

impl Model<'_> {
    /// One page: returns its node, or `None` for an empty set.
    fn page(&mut self) -> Option<usize> {
        let first = *self.nodes.first()?;
        if self.left == 0 || !self.nodes.contains(&self.prev) {
            self.prev = self
                .nodes
                .iter()
                .copied()
                .find(|&n| n > self.prev)
                .unwrap_or(first);
            self.left = self.weights[self.prev];
        }
        self.left -= 1;
        Some(self.prev)
    }

    /// `(node of the next page, pages it has this turn counting that one)`.
    fn normalised(&self) -> (usize, u8) {
        let mut m = *self;
        match m.page() {
            Some(n) => (n, m.left + 1),
            None => (self.prev, self.left),
        }
    }
}

fn initial_state() -> impl Strategy<Value = (usize, u8)> {
    prop_oneof![
        (0..SPAN, any::<u8>()),
        (Just(MAX_NODES - 1), any::<u8>()),
        (Just(MAX_NODES - 1), Just(0u8)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn bulk_matches_single_pages(
        set in proptest::collection::btree_set(0..SPAN, 0..=64usize),
        weights in proptest::collection::vec(1u8..=255, SPAN),
        (prev, left) in initial_state(),
        calls in proptest::collection::vec(0u64..=100_000, 1..=8usize),
    ) {
        let list: Vec<usize> = set.iter().copied().collect();
        let nodes = NodeMask::from_nodes(list.iter().map(|&n| NodeId::new(n)));
        let w = Weights::new(&weights).unwrap();
        let mut state = IlState::from_raw(NodeId::new(prev), left);
        let mut model = Model { nodes: &list, weights: &weights, prev, left };

        for (i, &pages) in calls.iter().enumerate() {
            let got = bulk(&mut state, &nodes, &w, pages);
            let mut want = BTreeMap::new();
            for _ in 0..pages {
                if let Some(n) = model.page() {
                    *want.entry(n).or_insert(0u64) += 1;
                }
            }
            prop_assert_eq!(&got, &want, "call {} of {} pages", i, pages);
            prop_assert_eq!(
                (state.prev().index(), state.left()),
                (model.prev, model.left),
                "raw state after call {}", i
            );
            let (node, left) = state.normalised(&nodes, &w);
            prop_assert_eq!((node.index(), left), model.normalised(), "state after call {}", i);
        }
    }

    #[test]
    fn single_pages_match_model(
        set in proptest::collection::btree_set(0..SPAN, 0..=64usize),
        weights in proptest::collection::vec(1u8..=255, SPAN),
        (prev, left) in initial_state(),
        pages in 0usize..2_000,
    ) {
        let list: Vec<usize> = set.iter().copied().collect();
        let nodes = NodeMask::from_nodes(list.iter().map(|&n| NodeId::new(n)));
        let w = Weights::new(&weights).unwrap();
        let mut state = IlState::from_raw(NodeId::new(prev), left);
        let mut model = Model { nodes: &list, weights: &weights, prev, left };
        for _ in 0..pages {
            prop_assert_eq!(state.next_node(&nodes, &w).map(NodeId::index), model.page());
            prop_assert_eq!((state.prev().index(), state.left()), (model.prev, model.left));
        }
    }

    #[test]
    fn auto_weights_follow_formula(
        bw in proptest::collection::vec(proptest::option::weighted(0.95, any::<u32>()), 1..16usize),
        set in proptest::collection::btree_set(0..16usize, 1..8usize),
    ) {
        let nodes = NodeMask::from_nodes(set.iter().map(|&n| NodeId::new(n)));
        let result = Weights::auto(&bw, &nodes);
        let missing: BTreeSet<usize> =
            set.iter().copied().filter(|&n| bw.get(n).copied().flatten().is_none()).collect();
        if let Some(&first) = missing.first() {
            prop_assert_eq!(
                result,
                Err(numaframe::PolicyError::MissingBandwidth { node: NodeId::new(first) })
            );
            return Ok(());
        }
        let w = result.unwrap();
        let sum: u64 = set.iter().map(|&n| u64::from(bw[n].unwrap())).sum();
        let raw: Vec<u64> = set
            .iter()
            .map(|&n| (32 * u64::from(bw[n].unwrap())).checked_div(sum).map_or(1, |q| q.max(1)))
            .collect();
        let g = raw.iter().fold(0u64, |a, &b| {
            let (mut x, mut y) = (a, b);
            while y != 0 {
                (x, y) = (y, x % y);
            }
            x
        });
        for (&n, &r) in set.iter().zip(&raw) {
            prop_assert_eq!(u64::from(w.get(NodeId::new(n))), r / g, "node {}", n);
        }
        for n in (0..16).filter(|n| !set.contains(n)) {
            prop_assert_eq!(w.get(NodeId::new(n)), 1, "node {} outside the set", n);
        }
    }
}
