//! numastat counters, with Linux's meanings.
#![deny(unsafe_code)]

use crate::sync::{AtomicU64, Ordering};
use crate::topology::NodeId;

/// One node's numastat counters (`/sys/devices/system/node/nodeN/numastat`).
///
/// Each counter is an independent event count, so they are plain relaxed atomics: no reader
/// needs two of them to agree at one instant.
#[derive(Debug, Default)]
pub struct NumaStats {
    hit: AtomicU64,
    miss: AtomicU64,
    foreign: AtomicU64,
    interleave_hit: AtomicU64,
    local: AtomicU64,
    other: AtomicU64,
}

/// A snapshot of [`NumaStats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NumaStat {
    /// Allocations that landed on this node when it was the preferred node.
    pub numa_hit: u64,
    /// Allocations that landed on this node although another node was preferred.
    pub numa_miss: u64,
    /// Allocations that preferred this node but landed elsewhere.
    pub numa_foreign: u64,
    /// Interleave allocations that landed on the node the interleave chose.
    pub interleave_hit: u64,
    /// Allocations on this node made by a CPU of this node.
    pub local_node: u64,
    /// Allocations on this node made by a CPU of another node.
    pub other_node: u64,
}

/// Which counter an event bumps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Event {
    Hit = 0,
    Miss,
    Foreign,
    InterleaveHit,
    Local,
    Other,
}

impl Event {
    /// Index into per-event arrays.
    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

impl NumaStat {
    /// Adds per-event counts, indexed by `Event::index`.
    pub(crate) fn add_counts(&mut self, counts: &[u64; 6]) {
        self.numa_hit += counts[Event::Hit.index()];
        self.numa_miss += counts[Event::Miss.index()];
        self.numa_foreign += counts[Event::Foreign.index()];
        self.interleave_hit += counts[Event::InterleaveHit.index()];
        self.local_node += counts[Event::Local.index()];
        self.other_node += counts[Event::Other.index()];
    }
}

impl NumaStats {
    /// All counters zero.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Adds `n` to one counter.
    pub(crate) fn add(&self, event: Event, n: u64) {
        let c = match event {
            Event::Hit => &self.hit,
            Event::Miss => &self.miss,
            Event::Foreign => &self.foreign,
            Event::InterleaveHit => &self.interleave_hit,
            Event::Local => &self.local,
            Event::Other => &self.other,
        };
        // Relaxed: an event count orders nothing else.
        c.fetch_add(n, Ordering::Relaxed);
    }

    /// The current values.
    pub fn snapshot(&self) -> NumaStat {
        // Relaxed: see the type's comment.
        let r = |c: &AtomicU64| c.load(Ordering::Relaxed);
        NumaStat {
            numa_hit: r(&self.hit),
            numa_miss: r(&self.miss),
            numa_foreign: r(&self.foreign),
            interleave_hit: r(&self.interleave_hit),
            local_node: r(&self.local),
            other_node: r(&self.other),
        }
    }
}

/// The events an allocation on a node counts on that node itself: all but `numa_foreign`,
/// which belongs to the node it preferred. A zone counts them under the lock it already holds
/// ([`OwnCounts`]), so the node path bumps no shared counter unless it falls back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct OwnEvents {
    /// `numa_hit` (else `numa_miss`).
    hit: bool,
    /// `interleave_hit` as well.
    interleave: bool,
    /// `local_node` (else `other_node`).
    local: bool,
}

impl OwnEvents {
    /// The events on `got` of an allocation there for a CPU of `cpu_node` that preferred
    /// `preferred` (`il`: an interleave allocation), as [`tally`] counts them.
    pub(crate) fn of(cpu_node: NodeId, preferred: NodeId, got: NodeId, il: bool) -> Self {
        OwnEvents {
            hit: got == preferred,
            interleave: il && got == preferred,
            local: got == cpu_node,
        }
    }
}

/// A zone's own share of its node's numastat, per event (indexed by [`Event::index`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct OwnCounts(pub(crate) [u64; 6]);

impl OwnCounts {
    /// Counts `n` allocations that made `e`.
    pub(crate) fn record(&mut self, e: OwnEvents, n: u64) {
        let c = &mut self.0;
        c[if e.hit { Event::Hit } else { Event::Miss }.index()] += n;
        if e.interleave {
            c[Event::InterleaveHit.index()] += n;
        }
        c[if e.local { Event::Local } else { Event::Other }.index()] += n;
    }
}

/// Linux's `zone_statistics()`: which numastat events one allocation of `n` pages on `got`
/// makes, for a CPU of `cpu_node` that preferred `preferred`. `add(node, event, n)` records one.
pub(crate) fn tally(
    cpu_node: NodeId,
    preferred: NodeId,
    got: NodeId,
    n: u64,
    il: bool,
    mut add: impl FnMut(NodeId, Event, u64),
) {
    if got == preferred {
        add(got, Event::Hit, n);
        if il {
            add(got, Event::InterleaveHit, n);
        }
    } else {
        add(got, Event::Miss, n);
        add(preferred, Event::Foreign, n);
    }
    add(
        got,
        if got == cpu_node {
            Event::Local
        } else {
            Event::Other
        },
        n,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A zone's own counts are exactly what `tally` (Linux's `zone_statistics`) counts on the
    /// node the allocation landed on, for every combination of CPU node, preferred node,
    /// landing node and interleave; `numa_foreign` stays with the preferred node.
    #[test]
    fn own_counts_are_tally_on_the_landing_node() {
        let n = NodeId::new;
        for (cpu, preferred, got) in (0..27).map(|i| (n(i / 9), n(i / 3 % 3), n(i % 3))) {
            for il in [false, true] {
                let mut want = [0u64; 6];
                let mut foreign = 0;
                tally(cpu, preferred, got, 5, il, |node, e, k| {
                    if e == Event::Foreign {
                        assert_eq!(node, preferred);
                        foreign += k;
                    } else {
                        assert_eq!(node, got);
                        want[e.index()] += k;
                    }
                });
                let mut own = OwnCounts::default();
                own.record(OwnEvents::of(cpu, preferred, got, il), 5);
                assert_eq!(own.0, want, "{cpu:?} {preferred:?} {got:?} {il}");
                assert_eq!(foreign, if got == preferred { 0 } else { 5 });
            }
        }
    }
}
