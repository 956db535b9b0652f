//! The jobs of one round: which nodes a round asks for how many pages, cut into chunks and
//! indexed so that consecutive indices go round the nodes.
#![deny(unsafe_code)]

use super::cmdline::NodeCount;
use crate::addr::HugeSize;
use crate::machine::Machine;
use crate::topology::{NodeId, NodeMask};

/// Pages the `rank`-th node of a spread is filled to: `level`, one more for the first `extra`
/// nodes, at most `clamp`.
pub(super) fn spread_target(level: u64, extra: usize, rank: usize, clamp: u64) -> u64 {
    level.saturating_add(u64::from(rank < extra)).min(clamp)
}

/// One round of a node-balanced request.
///
/// The `active` nodes (those with memory not yet found short) are filled to `level` pages, one
/// more for the first `extra` of them; the nodes found short keep what they hold.
#[derive(Clone, Copy, Debug)]
pub(super) struct Spread {
    /// Pages the request asks for over all nodes.
    pub(super) requested: u64,
    pub(super) active: NodeMask,
    pub(super) level: u64,
    pub(super) extra: usize,
    /// The previous round's `(active, level, extra)`, whose targets the active nodes reached;
    /// `None` in the first round, when every node starts from 0.
    pub(super) prev: Option<(NodeMask, u64, usize)>,
}

impl Spread {
    /// A round that spreads what `requested` leaves after `kept` over `active`.
    pub(super) fn new(
        requested: u64,
        kept: u64,
        active: NodeMask,
        prev: Option<(NodeMask, u64, usize)>,
    ) -> Self {
        let left = requested.saturating_sub(kept);
        let m = active.count().max(1) as u64;
        Spread {
            requested,
            active,
            level: left / m,
            // `left % m < m <= MAX_NODES`.
            extra: (left % m) as usize,
            prev,
        }
    }
}

#[derive(Clone, Debug)]
#[allow(
    clippy::large_enum_variant,
    reason = "no heap to box the spread in; a plan holds one round"
)]
pub(super) enum RoundKind<'c> {
    /// The node form: the entries of the command line, each on its own node.
    PerNode(&'c [NodeCount]),
    /// A node-balanced request.
    Balanced(Spread),
}

/// The jobs of one batch: `targets` nodes, each with up to `slots` chunks. Job `i` is chunk
/// `i / targets` of target `i % targets`.
#[derive(Clone, Debug)]
pub(super) struct Round<'c> {
    /// The page size every job reserves.
    pub(super) size: HugeSize,
    /// The most pages one job asks for.
    pub(super) chunk: u64,
    /// One more than the most pages of `size` any node could hold: a target at or beyond it
    /// cannot be met, whatever its exact value, so targets are capped there (and so are job
    /// counts, whatever the command line asks for).
    pub(super) clamp: u64,
    targets: usize,
    /// Chunks of the target that asks for the most pages; 0 for a round without work.
    pub(super) slots: u64,
    pub(super) kind: RoundKind<'c>,
}

impl<'c> Round<'c> {
    pub(super) fn new(size: HugeSize, chunk: u64, clamp: u64, kind: RoundKind<'c>) -> Self {
        let (targets, most) = match &kind {
            RoundKind::PerNode(entries) => (
                entries.len(),
                entries
                    .iter()
                    .map(|e| e.count.min(clamp))
                    .max()
                    .unwrap_or(0),
            ),
            RoundKind::Balanced(s) => {
                let now = spread_target(s.level, s.extra, 0, clamp);
                let before = s.prev.map_or(0, |(_, level, _)| level.min(clamp));
                (s.active.count(), now.saturating_sub(before))
            }
        };
        Round {
            size,
            chunk,
            clamp,
            targets,
            slots: most.div_ceil(chunk),
            kind,
        }
    }

    pub(super) fn job_count(&self) -> usize {
        (self.targets as u64)
            .checked_mul(self.slots)
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(usize::MAX)
    }

    /// The node of target `t` and the pages this round asks of it.
    fn target(&self, t: usize) -> Option<(NodeId, u64)> {
        match &self.kind {
            RoundKind::PerNode(entries) => {
                entries.get(t).map(|e| (e.node, e.count.min(self.clamp)))
            }
            RoundKind::Balanced(s) => {
                let node = s.active.nth(t)?;
                let now = spread_target(s.level, s.extra, t, self.clamp);
                let before = s.prev.map_or(0, |(active, level, extra)| {
                    spread_target(level, extra, active.rank(node), self.clamp)
                });
                Some((node, now.saturating_sub(before)))
            }
        }
    }

    pub(super) fn job(&self, i: usize) -> Option<HugeJob> {
        if self.targets == 0 {
            return None;
        }
        let slot = (i / self.targets) as u64;
        if slot >= self.slots {
            return None;
        }
        let (node, pages) = self.target(i % self.targets)?;
        // `slot < slots = ceil(most / chunk)`, so this does not overflow.
        let count = pages.checked_sub(slot * self.chunk)?.min(self.chunk);
        (count > 0).then_some(HugeJob {
            node,
            size: self.size,
            count,
        })
    }
}

/// Reserve up to `count` pages of `size` on `node`: one independent piece of a
/// [`Batch`](super::Batch).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct HugeJob {
    /// The node whose pool grows; the job touches only its zones.
    pub node: NodeId,
    /// The page size.
    pub size: HugeSize,
    /// Pages to reserve, at least 1.
    pub count: u64,
}

impl HugeJob {
    /// Reserves the pages ([`Machine::reserve_huge`], taking each of the node's zone locks
    /// once) and returns how many it got: fewer than `count` only when the node ran out.
    pub fn run(&self, machine: &Machine<'_>) -> u64 {
        machine.reserve_huge(self.node, self.size, self.count)
    }
}
