//! Weighted interleave: which node serves each page of a task, one page at a time or in bulk.
//!
//! # The rule (Linux's `weighted_interleave_nodes()`, the contract in docs/interleave.md)
//!
//! A task owns an [`IlState`] `(prev, left)`, initially `(MAX_NODES - 1, 0)`. For one page: if
//! `left == 0` or `prev` is not in the policy's nodes, then `prev` becomes the next node of the
//! set after `prev` (wrapping) and `left` becomes that node's [`Weights`] entry. Then `left -= 1`
//! and the page goes on `prev`. So each node of the set serves `weight` pages in a row (its
//! *turn*), in ascending node order, round after round.
//!
//! # The bulk plan and why the fold is correct
//!
//! [`plan_bulk`] decides where `pages` pages go with at most one node bulk per node, and leaves
//! exactly the per-node counts and the `(prev, left)` that `pages` single-page calls would leave.
//!
//! Write `c` for the node that serves the next page and `r` for the pages it still has this turn
//! (the normalised state, [`IlState::normalised`]); `r >= 1`. Single pages from here are served
//! as the sequence
//!
//! ```text
//! c × r,  then rounds of  n1 × w(n1), n2 × w(n2), …, nk × w(nk), c × w(c)
//! ```
//!
//! where `n1 … nk` are the other nodes of the set in cyclic order after `c`. A round therefore
//! ends with `c`'s full turn, and every round has `S = Σ w` pages. After the first `r` pages the
//! remaining `t = pages - r` pages are `q = t / S` full rounds and a final partial round of
//! `p = t % S` pages, which fills `n1, n2, …` in that order and reaches `c` only after all the
//! others, i.e. only for `p > S - w(c)`. Hence
//!
//! - `c` gets `r + q·w(c) + max(0, p - (S - w(c)))`,
//! - `ni` gets `q·w(ni) + min(w(ni), what is left of p after n1 … n(i-1))`,
//!
//! and every one of these is known before the first node bulk is made, so `c`'s pages — its
//! partly consumed turn, its later full turns and a possible final partial turn — go into one
//! call. Charging the remainder `r` to `c` (the node the state names) and not to the node the
//! bulk would otherwise start with is the point: Linux's 2025 attempt to fold it charged it to the
//! wrong node, so weights 10,7 with state `(0, 7)` and 14 pages gave 14 and 0 instead of 7 and 7.
//!
//! The state afterwards is that of the last page: if `p == 0` the last page ended `c`'s turn,
//! `(c, 0)`; otherwise it is the node where the partial round stops, with its unused share.
//!
//! The cost is a few passes over the mask (`O(MAX_NODES / 64 + nodes in the mask)`) plus
//! constant arithmetic, whatever `pages` is: full rounds are a division, never a loop.
#![deny(unsafe_code)]

use core::fmt;

use crate::error::PolicyError;
use crate::topology::{MAX_NODES, NodeId, NodeMask};

/// The weight a node with all the bandwidth would get before the gcd reduction (Linux's
/// `weightiness`).
const AUTO_WEIGHT_SCALE: u64 = 32;

/// `prev` of a fresh task.
const FRESH_PREV: NodeId = NodeId::new(MAX_NODES - 1);

/// Interleave weights, one per node, each `1..=255`, in a fixed table without a heap.
///
/// Invariant: every entry is at least 1, so every turn serves at least one page. Nodes for which
/// no weight was given weigh 1 (plain interleave).
#[derive(Clone, PartialEq, Eq)]
pub struct Weights {
    /// `table[n]` is the weight of node `n`.
    table: [u8; MAX_NODES],
    /// Number of entries given at construction (`<= MAX_NODES`).
    len: u16,
}

impl Default for Weights {
    /// Every node weighs 1: plain interleave.
    fn default() -> Self {
        Weights {
            table: [1; MAX_NODES],
            len: 0,
        }
    }
}

impl fmt::Debug for Weights {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Weights")
            .field("given", &self.as_slice())
            .finish_non_exhaustive()
    }
}

#[cfg(feature = "defmt")]
impl defmt::Format for Weights {
    fn format(&self, f: defmt::Formatter<'_>) {
        defmt::write!(f, "Weights {{ given: {=[u8]} }}", self.as_slice());
    }
}

impl Weights {
    /// The weights `weights[n]` for node `n`; nodes from `weights.len()` on weigh 1.
    ///
    /// # Errors
    /// [`PolicyError::ZeroWeight`] for a weight of 0 (the lowest node with one), and
    /// [`PolicyError::WeightCount`] for more than [`MAX_NODES`] entries.
    pub fn new(weights: &[u8]) -> Result<Weights, PolicyError> {
        if weights.len() > MAX_NODES {
            return Err(PolicyError::WeightCount {
                given: weights.len(),
                nodes: MAX_NODES,
            });
        }
        let mut w = Weights::default();
        for (node, (slot, &weight)) in w.table.iter_mut().zip(weights).enumerate() {
            if weight == 0 {
                // `node < weights.len() <= MAX_NODES`: `new` cannot panic.
                return Err(PolicyError::ZeroWeight {
                    node: NodeId::new(node),
                });
            }
            *slot = weight;
        }
        w.len = weights.len() as u16;
        Ok(w)
    }

    /// Weights from memory bandwidth, with the formula of Linux's auto mode over `nodes` (Linux
    /// sums over every node with memory: see docs/interleave.md): for each node `n` of `nodes`,
    /// `w(n) = max(1, floor(32 · bw(n) / Σ bw))` over the set, then all divided by their gcd. So 300,300,100,100 gives 3,3,1,1 and 200,100 gives 21,10. `bandwidths[n]` is
    /// node `n`'s bandwidth (any unit); nodes outside the set weigh 1. If every node of the set
    /// has bandwidth 0, they all weigh 1.
    ///
    /// # Errors
    /// [`PolicyError::EmptyMask`] if `nodes` is empty, [`PolicyError::MissingBandwidth`] for the
    /// lowest node of the set without a bandwidth (`None` or beyond the slice), and
    /// [`PolicyError::WeightCount`] for more than [`MAX_NODES`] entries.
    pub fn auto(bandwidths: &[Option<u32>], nodes: &NodeMask) -> Result<Weights, PolicyError> {
        if bandwidths.len() > MAX_NODES {
            return Err(PolicyError::WeightCount {
                given: bandwidths.len(),
                nodes: MAX_NODES,
            });
        }
        let bandwidth = |n: NodeId| bandwidths.get(n.index()).copied().flatten();
        // At most MAX_NODES · u32::MAX < 2^42: no overflow.
        let mut sum = 0u64;
        for n in nodes {
            match bandwidth(n) {
                Some(bw) => sum += u64::from(bw),
                None => return Err(PolicyError::MissingBandwidth { node: n }),
            }
        }
        if nodes.is_empty() {
            return Err(PolicyError::EmptyMask);
        }
        let mut w = Weights {
            len: bandwidths.len() as u16,
            ..Weights::default()
        };
        let mut divisor = 0u8;
        for n in nodes {
            let bw = u64::from(bandwidth(n).unwrap_or(0));
            // 32 · bw < 2^37; the quotient is at most 32 because bw <= sum. A zero sum means
            // every node of the set has bandwidth 0: all weigh 1.
            let scaled = (AUTO_WEIGHT_SCALE * bw)
                .checked_div(sum)
                .map_or(1, |q| q.max(1));
            let weight = u8::try_from(scaled).unwrap_or(u8::MAX);
            w.table[n.index()] = weight;
            divisor = gcd(divisor, weight);
        }
        // The set is not empty and every weight is >= 1, so divisor >= 1 and every quotient too.
        for n in nodes {
            w.table[n.index()] /= divisor.max(1);
        }
        Ok(w)
    }

    /// The weight of `node`, `1..=255`.
    pub fn get(&self, node: NodeId) -> u8 {
        // `NodeId` is always `< MAX_NODES`.
        self.table[node.index()]
    }

    /// The entries given at construction (`weights` of [`Weights::new`], or one per entry of
    /// `bandwidths` of [`Weights::auto`]); all later nodes weigh 1.
    pub fn as_slice(&self) -> &[u8] {
        &self.table[..usize::from(self.len)]
    }
}

/// Greatest common divisor; `gcd(0, b) == b`.
fn gcd(mut a: u8, mut b: u8) -> u8 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// A task's weighted-interleave cursor: the node of the last page, `prev`, and how many pages
/// it still has this turn, `left`.
///
/// Any `(prev, left)` is valid; `left` may exceed `prev`'s weight (the weights may have changed)
/// and `prev` need not be in the policy's nodes (the mask may have changed), in which case the
/// next page starts a fresh turn on the next node after `prev`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct IlState {
    prev: NodeId,
    left: u8,
}

impl Default for IlState {
    /// A fresh task, as [`IlState::new`].
    fn default() -> Self {
        Self::new()
    }
}

impl IlState {
    /// A fresh task: `(MAX_NODES - 1, 0)`, so the first page goes to the lowest node of the set.
    pub const fn new() -> Self {
        IlState {
            prev: FRESH_PREV,
            left: 0,
        }
    }

    /// The state `(prev, left)` as stored (not normalised).
    pub const fn from_raw(prev: NodeId, left: u8) -> Self {
        IlState { prev, left }
    }

    /// The node of the last page (raw state).
    pub const fn prev(&self) -> NodeId {
        self.prev
    }

    /// Pages `prev` still has this turn (raw state).
    pub const fn left(&self) -> u8 {
        self.left
    }

    /// `(node that serves the next page, pages it still has this turn)`, the pages counting that
    /// next one; `None` for an empty set. The count is at least 1.
    fn current(&self, nodes: &NodeMask, weights: &Weights) -> Option<(NodeId, u8)> {
        if self.left != 0 && nodes.contains(self.prev) {
            Some((self.prev, self.left))
        } else {
            let next = nodes.next_after_wrapping(self.prev)?;
            Some((next, weights.get(next)))
        }
    }

    /// The state as reported: `(node that serves the next page, pages it still has this turn,
    /// counting that page)`. That is `(prev, left)` if `left > 0` and `prev` is in `nodes`, and
    /// otherwise the next node of the set after `prev` with its full weight. For an empty set no
    /// node serves a page and the raw `(prev, left)` is returned.
    #[must_use]
    pub fn normalised(&self, nodes: &NodeMask, weights: &Weights) -> (NodeId, u8) {
        self.current(nodes, weights)
            .unwrap_or((self.prev, self.left))
    }

    /// Advances by one page and returns the node that serves it; `None` (state unchanged) only
    /// if `nodes` is empty.
    pub fn next_node(&mut self, nodes: &NodeMask, weights: &Weights) -> Option<NodeId> {
        let (node, left) = self.current(nodes, weights)?;
        // `current` never reports fewer than 1 page (weights are >= 1).
        *self = IlState {
            prev: node,
            left: left.saturating_sub(1),
        };
        Some(node)
    }
}

/// Plans a bulk of `pages` pages: calls `emit(node, count)` once for each node that gets
/// `count > 0` pages, in the order the pages would be served starting from the current node, and
/// advances `state` exactly as `pages` calls of [`IlState::next_node`] would. The current node's
/// partly consumed turn is folded into its single call together with its later turns (see the
/// [module docs](self)).
///
/// At most one call per node, so at most `nodes.count()` calls. An empty `nodes` or
/// `pages == 0` emits nothing and leaves `state` unchanged. The cost does not depend on `pages`.
pub fn plan_bulk(
    state: &mut IlState,
    nodes: &NodeMask,
    weights: &Weights,
    pages: u64,
    mut emit: impl FnMut(NodeId, u64),
) {
    if pages == 0 {
        return;
    }
    let Some((cur, left)) = state.current(nodes, weights) else {
        return;
    };
    if pages <= u64::from(left) {
        emit(cur, pages);
        // `pages >= 1`, so the difference is below `left` and fits.
        *state = IlState {
            prev: cur,
            left: left - pages as u8,
        };
        return;
    }
    let left = u64::from(left);
    let after_turn = pages - left;
    // At most MAX_NODES · 255, and >= 1 because `cur` is in the set.
    let round: u64 = nodes.iter().map(|n| u64::from(weights.get(n))).sum();
    let rounds = after_turn / round;
    let partial = after_turn % round;
    let cur_weight = weights.get(cur);
    // The partial round reaches `cur` only after every other node's full turn.
    let others = round - u64::from(cur_weight);
    let cur_tail = partial.saturating_sub(others);
    // Every count is a sum of pages served, so it is at most `pages`: no overflow.
    emit(cur, left + rounds * u64::from(cur_weight) + cur_tail);

    // `cur_tail < cur_weight` because `partial < round`. The loop overrides this if the partial
    // round stops on another node.
    let mut end = if partial == 0 {
        IlState { prev: cur, left: 0 }
    } else {
        IlState {
            prev: cur,
            left: cur_weight - cur_tail as u8,
        }
    };
    let mut rest = partial;
    let after = nodes.iter().filter(|&n| n > cur);
    let before = nodes.iter().filter(|&n| n < cur);
    for n in after.chain(before) {
        let weight = weights.get(n);
        let share = rest.min(u64::from(weight));
        if share == 0 && rounds == 0 {
            // The pages ran out before this node; so they did for the rest.
            break;
        }
        if share != 0 && share == rest {
            // The partial round stops here. `share <= weight`, so the difference fits.
            end = IlState {
                prev: n,
                left: weight - share as u8,
            };
        }
        rest -= share;
        emit(n, rounds * u64::from(weight) + share);
    }
    *state = end;
}

#[cfg(test)]
mod tests {
    extern crate std;

    use std::vec::Vec;

    use super::*;

    const N: usize = 4;
    /// The fresh `prev` as a plain number.
    const FRESH: usize = MAX_NODES - 1;

    /// Independent oracle: the single-page rule of docs/interleave.md on plain numbers, with the set as a
    /// bit mask over nodes `0..N`. Returns the node of the page, or `None` for an empty set.
    fn oracle_page(mask: u8, weights: &[u8; N], prev: &mut usize, left: &mut u8) -> Option<usize> {
        if mask == 0 {
            return None;
        }
        let in_set = |n: usize| n < N && mask & (1 << n) != 0;
        if *left == 0 || !in_set(*prev) {
            // Next node in the set after prev, wrapping.
            let mut next = None;
            for n in 0..N {
                if n > *prev && in_set(n) {
                    next = Some(n);
                    break;
                }
            }
            if next.is_none() {
                for n in 0..N {
                    if in_set(n) {
                        next = Some(n);
                        break;
                    }
                }
            }
            *prev = next.unwrap();
            *left = weights[*prev];
        }
        *left -= 1;
        Some(*prev)
    }

    fn mask_of(bits: u8) -> NodeMask {
        NodeMask::from_nodes((0..N).filter(|n| bits & (1 << n) != 0).map(NodeId::new))
    }

    /// Runs `plan_bulk` and checks the emits: at most one per node, none empty, at most one per
    /// node of the set. Returns the per-node counts.
    fn bulk(state: &mut IlState, nodes: &NodeMask, w: &Weights, pages: u64) -> [u64; N] {
        let mut counts = [0u64; N];
        let mut seen = [false; N];
        let mut calls = 0;
        plan_bulk(state, nodes, w, pages, |node, count| {
            assert!(nodes.contains(node), "emit for {node:?} outside the set");
            assert!(count > 0, "empty emit for {node:?}");
            assert!(!seen[node.index()], "second emit for {node:?}");
            seen[node.index()] = true;
            counts[node.index()] = count;
            calls += 1;
        });
        assert!(calls <= nodes.count());
        counts
    }

    /// Every configuration over 4 nodes: masks, weights 1..=3, initial states.
    const ALL_MASKS: [u8; 1 << N] = {
        let mut m = [0u8; 1 << N];
        let mut i = 0;
        while i < m.len() {
            m[i] = i as u8;
            i += 1;
        }
        m
    };

    fn for_all_small(mut f: impl FnMut(u8, [u8; N], usize, u8)) {
        // Miri interprets ~5000x slower: it checks two masks with one uneven weight table.
        let (masks, codes) = if cfg!(miri) {
            (&[0b0101u8, 0b1111][..], 41..42)
        } else {
            (&ALL_MASKS[..], 0..3usize.pow(N as u32))
        };
        for &mask in masks {
            for code in codes.clone() {
                let mut weights = [0u8; N];
                for (i, w) in weights.iter_mut().enumerate() {
                    *w = (code / 3usize.pow(i as u32) % 3) as u8 + 1;
                }
                for prev in (0..N).chain([FRESH]) {
                    for left in 0..=3u8 {
                        f(mask, weights, prev, left);
                    }
                }
            }
        }
    }

    const MAX_PAGES: usize = 20;

    /// Oracle run of `2 * MAX_PAGES` pages: the state and the cumulative counts after each page.
    fn oracle_prefixes(
        mask: u8,
        weights: &[u8; N],
        prev: usize,
        left: u8,
    ) -> Vec<((usize, u8), [u64; N])> {
        let (mut prev, mut left) = (prev, left);
        let mut counts = [0u64; N];
        let mut out = Vec::with_capacity(2 * MAX_PAGES + 1);
        out.push(((prev, left), counts));
        for _ in 0..2 * MAX_PAGES {
            if let Some(n) = oracle_page(mask, weights, &mut prev, &mut left) {
                counts[n] += 1;
            }
            out.push(((prev, left), counts));
        }
        out
    }

    fn raw(s: &IlState) -> (usize, u8) {
        (s.prev().index(), s.left())
    }

    fn diff(a: &[u64; N], b: &[u64; N]) -> [u64; N] {
        core::array::from_fn(|i| a[i] - b[i])
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "safe arithmetic over every small case: the release-checked run covers it"
    )]
    fn exhaustive_small_against_oracle() {
        for_all_small(|mask, weights, prev, left| {
            let nodes = mask_of(mask);
            let w = Weights::new(&weights).unwrap();
            let start = IlState::from_raw(NodeId::new(prev), left);
            let pre = oracle_prefixes(mask, &weights, prev, left);
            let ctx = (mask, weights, prev, left);

            // Single pages.
            let mut s = start;
            for (i, step) in pre.iter().enumerate().skip(1) {
                let n = s.next_node(&nodes, &w).map(NodeId::index);
                let want = (0..N).find(|&k| step.1[k] != pre[i - 1].1[k]);
                assert_eq!(n, want, "{ctx:?} page {i}");
                assert_eq!(raw(&s), step.0, "{ctx:?} page {i}");
            }

            // One bulk, then a second one straight after.
            for a in 0..=MAX_PAGES {
                let mut s = start;
                let counts = bulk(&mut s, &nodes, &w, a as u64);
                assert_eq!(counts, pre[a].1, "{ctx:?} bulk {a}");
                assert_eq!(raw(&s), pre[a].0, "{ctx:?} bulk {a}");
                for b in 0..=MAX_PAGES {
                    let mut s2 = s;
                    let counts = bulk(&mut s2, &nodes, &w, b as u64);
                    assert_eq!(
                        counts,
                        diff(&pre[a + b].1, &pre[a].1),
                        "{ctx:?} {a} then {b}"
                    );
                    assert_eq!(raw(&s2), pre[a + b].0, "{ctx:?} {a} then {b}");
                }
            }
        });
    }

    #[test]
    fn normalised_matches_next_page() {
        for_all_small(|mask, weights, prev, left| {
            let nodes = mask_of(mask);
            let w = Weights::new(&weights).unwrap();
            let s = IlState::from_raw(NodeId::new(prev), left);
            let (node, n_left) = s.normalised(&nodes, &w);
            if mask == 0 {
                assert_eq!((node.index(), n_left), (prev, left));
                return;
            }
            // The next page goes on `node`, and so do exactly `n_left` pages in a row.
            let (mut p, mut l) = (prev, left);
            let first = oracle_page(mask, &weights, &mut p, &mut l).unwrap();
            assert_eq!(first, node.index());
            assert_eq!(l + 1, n_left);
        });
    }

    #[test]
    fn seed_carryover() {
        let nodes = mask_of(0b11);
        let w = Weights::new(&[10, 7]).unwrap();
        let mut s = IlState::from_raw(NodeId::new(0), 7);
        let mut emits = Vec::new();
        plan_bulk(&mut s, &nodes, &w, 14, |n, c| emits.push((n.index(), c)));
        assert_eq!(emits, [(0, 7), (1, 7)]);
        assert_eq!(s.normalised(&nodes, &w), (NodeId::new(0), 10));
    }

    #[test]
    fn weights_3_1_fresh() {
        let nodes = mask_of(0b11);
        let w = Weights::new(&[3, 1]).unwrap();
        let at = |pages| {
            let mut s = IlState::new();
            plan_bulk(&mut s, &nodes, &w, pages, |_, _| {});
            let (n, l) = s.normalised(&nodes, &w);
            (n.index(), l)
        };
        assert_eq!(at(0), (0, 3));
        assert_eq!(at(1), (0, 2));
        assert_eq!(at(3), (1, 1));
        assert_eq!(at(4), (0, 3));
    }

    #[test]
    fn emit_order_follows_service() {
        // Current node 2 with 1 left; set {0, 1, 2, 3}; 1 + 3 + 3 + 1 + 1 pages.
        let nodes = mask_of(0b1111);
        let w = Weights::new(&[3, 3, 1, 1]).unwrap();
        let mut s = IlState::from_raw(NodeId::new(2), 1);
        let mut emits = Vec::new();
        plan_bulk(&mut s, &nodes, &w, 9, |n, c| emits.push((n.index(), c)));
        assert_eq!(emits, [(2, 2), (3, 1), (0, 3), (1, 3)]);
        assert_eq!(raw(&s), (2, 0));
    }

    #[test]
    fn huge_bulks_do_not_overflow() {
        let nodes = mask_of(0b11);
        let w = Weights::new(&[10, 7]).unwrap();
        for pages in [u64::MAX / 2, u64::MAX / 2 + 1, u64::MAX - 1, u64::MAX] {
            for start in [IlState::new(), IlState::from_raw(NodeId::new(0), 7)] {
                let mut s = start;
                let mut counts = [0u64; 2];
                plan_bulk(&mut s, &nodes, &w, pages, |n, c| counts[n.index()] = c);
                assert_eq!(counts[0].checked_add(counts[1]), Some(pages));
                // Position in the 17-page cycle 0×10, 1×7, counted from the start of a round.
                let (cur, left) = start.normalised(&nodes, &w);
                let offset = if cur.index() == 0 {
                    10 - u64::from(left)
                } else {
                    17 - u64::from(left)
                };
                let pos = ((pages % 17) + offset) % 17;
                let want = if pos == 0 {
                    (1, 0)
                } else if pos <= 10 {
                    (0, (10 - pos) as u8)
                } else {
                    (1, (17 - pos) as u8)
                };
                assert_eq!(raw(&s), want, "{pages} from {start:?}");
            }
        }
        // Many nodes, heavy weights.
        let all = NodeMask::first_n(MAX_NODES);
        let w = Weights::new(&[255; MAX_NODES]).unwrap();
        let mut s = IlState::new();
        let mut total = 0u64;
        let mut calls = 0;
        plan_bulk(&mut s, &all, &w, u64::MAX, |_, c| {
            total += c;
            calls += 1;
        });
        assert_eq!((total, calls), (u64::MAX, MAX_NODES));
    }

    #[test]
    fn empty_mask_and_zero_pages() {
        let w = Weights::new(&[2, 2]).unwrap();
        let start = IlState::from_raw(NodeId::new(5), 3);
        let mut s = start;
        plan_bulk(&mut s, &NodeMask::EMPTY, &w, 10, |_, _| {
            panic!("emit on empty mask")
        });
        assert_eq!(s, start);
        assert_eq!(s.next_node(&NodeMask::EMPTY, &w), None);
        assert_eq!(s, start);
        assert_eq!(s.normalised(&NodeMask::EMPTY, &w), (NodeId::new(5), 3));
        plan_bulk(&mut s, &mask_of(0b11), &w, 0, |_, _| {
            panic!("emit for 0 pages")
        });
        assert_eq!(s, start);
    }

    #[test]
    fn prev_outside_mask() {
        // prev = 5 with pages left, set {1, 3}: the next turn starts on 1 (wrapping).
        let nodes = NodeMask::from_nodes([NodeId::new(1), NodeId::new(3)]);
        let w = Weights::new(&[9, 2, 9, 3]).unwrap();
        let mut s = IlState::from_raw(NodeId::new(5), 4);
        assert_eq!(s.normalised(&nodes, &w), (NodeId::new(1), 2));
        let mut emits = Vec::new();
        plan_bulk(&mut s, &nodes, &w, 6, |n, c| emits.push((n.index(), c)));
        assert_eq!(emits, [(1, 3), (3, 3)]);
        assert_eq!(raw(&s), (1, 1));
    }

    #[test]
    fn weights_new() {
        let w = Weights::new(&[3, 1]).unwrap();
        assert_eq!((w.get(NodeId::new(0)), w.get(NodeId::new(1))), (3, 1));
        assert_eq!(w.get(NodeId::new(MAX_NODES - 1)), 1);
        assert_eq!(w.as_slice(), &[3, 1]);
        assert_eq!(Weights::new(&[]).unwrap(), Weights::default());
        assert_eq!(
            Weights::new(&[1, 0, 0]),
            Err(PolicyError::ZeroWeight {
                node: NodeId::new(1)
            })
        );
        assert!(Weights::new(&[255; MAX_NODES]).is_ok());
        assert_eq!(
            Weights::new(&[1; MAX_NODES + 1]),
            Err(PolicyError::WeightCount {
                given: MAX_NODES + 1,
                nodes: MAX_NODES
            })
        );
    }

    fn auto(bw: &[Option<u32>], nodes: &NodeMask) -> Vec<u8> {
        let w = Weights::auto(bw, nodes).unwrap();
        (0..bw.len()).map(|n| w.get(NodeId::new(n))).collect()
    }

    #[test]
    fn weights_auto() {
        let s = |v: &[u32]| v.iter().map(|&b| Some(b)).collect::<Vec<_>>();
        assert_eq!(
            auto(&s(&[300, 300, 100, 100]), &mask_of(0b1111)),
            [3, 3, 1, 1]
        );
        assert_eq!(auto(&s(&[200, 100]), &mask_of(0b11)), [21, 10]);
        // A single node gets 32, reduced to 1.
        assert_eq!(auto(&s(&[200, 100]), &mask_of(0b01)), [1, 1]);
        // Outside the set: 1, and no bandwidth needed there.
        assert_eq!(
            auto(&[Some(200), None, Some(100)], &mask_of(0b101)),
            [21, 1, 10]
        );
        // Tiny shares round up to 1.
        assert_eq!(auto(&s(&[1000, 1, 1]), &mask_of(0b111)), [31, 1, 1]);
        // Zero bandwidth everywhere: equal weights.
        assert_eq!(auto(&s(&[0, 0]), &mask_of(0b11)), [1, 1]);
        assert_eq!(auto(&s(&[u32::MAX, u32::MAX]), &mask_of(0b11)), [1, 1]);
        assert_eq!(
            auto(&s(&[u32::MAX, u32::MAX / 2]), &mask_of(0b11)),
            [21, 10]
        );
        let all = NodeMask::first_n(MAX_NODES);
        let w = Weights::auto(&[Some(u32::MAX); MAX_NODES], &all).unwrap();
        assert!(all.iter().all(|n| w.get(n) == 1));

        assert_eq!(
            Weights::auto(&[Some(1), None], &mask_of(0b11)),
            Err(PolicyError::MissingBandwidth {
                node: NodeId::new(1)
            })
        );
        assert_eq!(
            Weights::auto(&[Some(1)], &mask_of(0b11)),
            Err(PolicyError::MissingBandwidth {
                node: NodeId::new(1)
            })
        );
        assert_eq!(
            Weights::auto(&[Some(1)], &NodeMask::EMPTY),
            Err(PolicyError::EmptyMask)
        );
        assert!(matches!(
            Weights::auto(&[Some(1); MAX_NODES + 1], &mask_of(1)),
            Err(PolicyError::WeightCount { .. })
        ));
    }
}
