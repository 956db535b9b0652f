//! The jobs of one round: which nodes a round asks for how many pages, cut into chunks and
//! indexed so that consecutive indices go round the nodes.
#![deny(unsafe_code)]

use super::cmdline::NodeCount;
use crate::addr::HugeSize;
use crate::machine::Machine;
use crate::topology::{NodeId, NodeMask};

/// The levels one round of a node-balanced request fills its nodes to: the `active` nodes
/// (those with memory not yet found short) get `level` pages, one more for the first `extra` of
/// them.
#[derive(Clone, Copy, Debug)]
pub(super) struct Fill {
    pub(super) active: NodeMask,
    pub(super) level: u64,
    pub(super) extra: usize,
}

impl Fill {
    /// Pages the `rank`-th node of `active` is filled to, at most `clamp`.
    pub(super) fn target(&self, rank: usize, clamp: u64) -> u64 {
        self.level
            .saturating_add(u64::from(rank < self.extra))
            .min(clamp)
    }
}

/// One round of a node-balanced request: its [`Fill`], while the nodes found short keep what
/// they hold.
#[derive(Clone, Copy, Debug)]
pub(super) struct Spread {
    /// Pages the request asks for over all nodes.
    pub(super) requested: u64,
    pub(super) fill: Fill,
    /// The previous round's fill, whose targets the active nodes reached; `None` in the first
    /// round, when every node starts from 0.
    pub(super) prev: Option<Fill>,
}

impl Spread {
    /// A round that spreads what `requested` leaves after `kept` over `active`.
    pub(super) fn new(requested: u64, kept: u64, active: NodeMask, prev: Option<Fill>) -> Self {
        let left = requested.saturating_sub(kept);
        let m = active.count().max(1) as u64;
        Spread {
            requested,
            fill: Fill {
                active,
                level: left / m,
                // `left % m < m <= MAX_NODES`.
                extra: (left % m) as usize,
            },
            prev,
        }
    }
}

/// What a round asks of one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Target {
    node: NodeId,
    pages: u64,
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
                let now = s.fill.target(0, clamp);
                let before = s.prev.map_or(0, |prev| prev.level.min(clamp));
                (s.fill.active.count(), now.saturating_sub(before))
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

    /// What this round asks of target `t`.
    fn target(&self, t: usize) -> Option<Target> {
        match &self.kind {
            RoundKind::PerNode(entries) => entries.get(t).map(|e| Target {
                node: e.node,
                pages: e.count.min(self.clamp),
            }),
            RoundKind::Balanced(s) => {
                let node = s.fill.active.nth(t)?;
                let now = s.fill.target(t, self.clamp);
                let before = s
                    .prev
                    .map_or(0, |prev| prev.target(prev.active.rank(node), self.clamp));
                Some(Target {
                    node,
                    pages: now.saturating_sub(before),
                })
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
        let target = self.target(i % self.targets)?;
        // `slot < slots = ceil(most / chunk)`, so this does not overflow.
        let count = target.pages.checked_sub(slot * self.chunk)?.min(self.chunk);
        (count > 0).then_some(HugeJob {
            node: target.node,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(ids: &[usize]) -> NodeMask {
        NodeMask::from_nodes(ids.iter().map(|&i| NodeId::new(i)))
    }

    fn targets(round: &Round<'_>) -> [Option<Target>; 4] {
        core::array::from_fn(|t| round.target(t))
    }

    #[test]
    fn a_follow_up_round_asks_for_what_the_last_one_did_not() {
        // 10 pages over nodes 0, 1, 2: 4, 3, 3.
        let first = Spread::new(10, 0, nodes(&[0, 1, 2]), None);
        let round = Round::new(HugeSize::Size2M, 2, u64::MAX, RoundKind::Balanced(first));
        let t = |node, pages| {
            Some(Target {
                node: NodeId::new(node),
                pages,
            })
        };
        assert_eq!(targets(&round), [t(0, 4), t(1, 3), t(2, 3), None]);
        assert_eq!((round.slots, round.job_count()), (2, 6));
        // Node 1 came up short with 1 page: the other 9 go to nodes 0 and 2 (5 and 4), which
        // hold 4 and 3 already.
        let next = Spread::new(10, 1, nodes(&[0, 2]), Some(first.fill));
        let round = Round::new(HugeSize::Size2M, 2, u64::MAX, RoundKind::Balanced(next));
        assert_eq!(targets(&round), [t(0, 1), t(2, 1), None, None]);
        let jobs: [Option<HugeJob>; 3] = core::array::from_fn(|i| round.job(i));
        let job = |node, count| {
            Some(HugeJob {
                node: NodeId::new(node),
                size: HugeSize::Size2M,
                count,
            })
        };
        assert_eq!(jobs, [job(0, 1), job(2, 1), None]);
        // The clamp caps every target.
        let round = Round::new(HugeSize::Size2M, 2, 3, RoundKind::Balanced(first));
        assert_eq!(targets(&round), [t(0, 3), t(1, 3), t(2, 3), None]);
    }
}
