//! Fallback orders and zonelists, built exactly as Linux's `build_zonelists()` builds them.
//!
//! For each node `local`, with one `load[]` shared by all nodes of one rebuild:
//! 1. `local` comes first if it has memory;
//! 2. the remaining nodes with memory follow in ascending
//!    `(dist(local,n) + [n < local] + [n has CPUs], load[n], n)`; a node at distance 255 (ACPI's
//!    "unreachable") is ordered by the same rule as any other, as Linux orders it;
//! 3. each time the raw distance differs from the previous entry's, the picked node's load
//!    grows by one (the accumulated-load fix that spreads remote allocations round-robin).
//!
//! Linux rescans all nodes for every pick (O(N³) per rebuild). Within one node's build only the
//! picked node's load changes, and the picked node leaves the candidate set, so the keys of the
//! remaining candidates never change: one sort per node gives the same order in O(N² log N).
#![deny(unsafe_code)]

use core::fmt;

use crate::topology::{LOCAL_DISTANCE, NodeId, NodeMask, Topology};

/// Which node states the build sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeStates {
    /// Nodes with memory (Linux's `N_MEMORY`).
    pub memory: NodeMask,
    /// Nodes with CPUs (Linux's non-empty `cpumask_of_node`).
    pub cpus: NodeMask,
}

/// Options of a fallback-order build.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FallbackOptions {
    /// Reproduce the order Linux prints at boot. x86 and arm64 build their first zonelists before
    /// the node CPU masks are filled, so the boot log orders nodes as if none had CPUs; the
    /// CPU penalty only shows on rebuilds after hotplug. numaframe applies it by default so that
    /// its order is the same before and after a rebuild.
    pub linux_boot_order: bool,
}

/// The fallback order of every node of a machine, in caller-provided storage: one block of
/// `n*n` entries, or one row of `n` entries per node wherever the caller put it (a booted machine
/// keeps each node's row in that node's own memory).
///
/// Invariant: row `i` (the first `lens[i]` entries of row `i`) lists distinct nodes with
/// memory, the local node first when it has memory.
#[derive(Debug)]
pub struct FallbackTable<'a> {
    n: usize,
    rows: Rows<'a>,
    lens: &'a mut [u16],
}

/// Where a [`FallbackTable`] keeps its rows.
#[derive(Debug)]
enum Rows<'a> {
    /// Row `i` is `ids[i*n..(i+1)*n]`.
    Block(&'a mut [NodeId]),
    /// Row `i` is `rows[i][..n]`.
    Split(&'a mut [&'a mut [NodeId]]),
}

impl<'a> FallbackTable<'a> {
    /// A table for `n` nodes over `ids` (at least `n*n` entries) and `lens` (at least `n`).
    /// Returns `None` if the storage is too small.
    pub fn new(n: usize, ids: &'a mut [NodeId], lens: &'a mut [u16]) -> Option<Self> {
        if ids.len() < n.checked_mul(n)? || lens.len() < n {
            return None;
        }
        lens[..n].fill(0);
        Some(Self {
            n,
            rows: Rows::Block(ids),
            lens,
        })
    }

    /// A table for `n` nodes whose row `i` is `rows[i]` (each at least `n` entries, `n` rows),
    /// with `lens` (at least `n`). Returns `None` if the storage is too small.
    pub(crate) fn from_rows(
        n: usize,
        rows: &'a mut [&'a mut [NodeId]],
        lens: &'a mut [u16],
    ) -> Option<Self> {
        if rows.len() < n || rows.iter().any(|r| r.len() < n) || lens.len() < n {
            return None;
        }
        lens[..n].fill(0);
        Some(Self {
            n,
            rows: Rows::Split(rows),
            lens,
        })
    }

    /// Number of nodes.
    pub fn nodes(&self) -> usize {
        self.n
    }

    /// The fallback order of `node`; empty for a node outside the table.
    pub fn order(&self, node: NodeId) -> &[NodeId] {
        let i = node.index();
        if i >= self.n {
            return &[];
        }
        let len = usize::from(self.lens[i]);
        match &self.rows {
            Rows::Block(ids) => &ids[i * self.n..i * self.n + len],
            Rows::Split(rows) => &rows[i][..len],
        }
    }

    /// Formats the row of `node` as Linux's boot log does: `Fallback order for Node 3: 3 2 1 0`.
    pub fn display(&self, node: NodeId) -> FallbackLine<'_> {
        FallbackLine {
            node,
            order: self.order(node),
        }
    }
}

/// One boot-log line, see [`FallbackTable::display`].
#[derive(Debug, Clone, Copy)]
pub struct FallbackLine<'a> {
    node: NodeId,
    order: &'a [NodeId],
}

impl fmt::Display for FallbackLine<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fallback order for Node {}:", self.node)?;
        for n in self.order {
            write!(f, " {n}")?;
        }
        Ok(())
    }
}

/// Scratch space for a build: `load` and `keys` need one entry per node each.
#[derive(Debug)]
pub struct Scratch<'a> {
    /// Accumulated node load.
    pub load: &'a mut [u32],
    /// Sort keys.
    pub keys: &'a mut [u64],
}

/// Builds the fallback order of every node of `topo` into `table`.
///
/// # Panics
/// If `table` or `scratch` hold fewer nodes than `topo` (a caller bug, not an input).
pub fn build_fallback(
    topo: &Topology<'_>,
    states: &NodeStates,
    opts: FallbackOptions,
    scratch: &mut Scratch<'_>,
    table: &mut FallbackTable<'_>,
) {
    let n = topo.len();
    // Rows are `table.n` entries apart; a table for more nodes keeps its extra rows empty.
    let stride = table.n;
    assert!(stride >= n, "fallback storage too small");
    let lens = &mut table.lens[..stride];
    lens.fill(0);
    // One match for the whole build: the entries are many (n² at most).
    match &mut table.rows {
        Rows::Block(ids) => for_each_entry(topo, states, opts, scratch, |local, i, node| {
            ids[local.index() * stride + i] = node;
            lens[local.index()] = (i + 1) as u16;
        }),
        Rows::Split(rows) => for_each_entry(topo, states, opts, scratch, |local, i, node| {
            rows[local.index()][i] = node;
            lens[local.index()] = (i + 1) as u16;
        }),
    }
}

/// The fallback orders of every node of `topo`, in node order, entry by entry: `entry(local,
/// i, node)` says that `node` is entry `i` of `local`'s order (Linux's `build_zonelists`, with
/// `find_next_best_node`'s accumulated load). Entry 0 of a node's order is Linux's
/// `local_memory_node()`, which `numa_mem_id()` gives a memoryless node.
///
/// # Panics
/// If `scratch` holds fewer nodes than `topo` (a caller bug, not an input).
pub(crate) fn for_each_entry(
    topo: &Topology<'_>,
    states: &NodeStates,
    opts: FallbackOptions,
    scratch: &mut Scratch<'_>,
    mut entry: impl FnMut(NodeId, usize, NodeId),
) {
    let n = topo.len();
    assert!(
        scratch.load.len() >= n && scratch.keys.len() >= n,
        "fallback storage too small"
    );
    let load = &mut scratch.load[..n];
    load.fill(0);
    let cpus = if opts.linux_boot_order {
        NodeMask::EMPTY
    } else {
        states.cpus
    };
    for local in topo.node_ids() {
        let keys = &mut scratch.keys[..];
        let mut k = 0;
        for cand in states.memory.iter().take_while(|c| c.index() < n) {
            if cand == local {
                continue;
            }
            let dist = topo.distance(local, cand);
            let adjusted =
                u64::from(dist) + u64::from(cand < local) + u64::from(cpus.contains(cand));
            keys[k] = adjusted << 32 | u64::from(load[cand.index()]) << 16 | cand.index() as u64;
            k += 1;
        }
        keys[..k].sort_unstable();
        let mut len = 0;
        let mut prev_dist = LOCAL_DISTANCE;
        if states.memory.contains(local) {
            entry(local, 0, local);
            len = 1;
        }
        for &key in &keys[..k] {
            let node = NodeId::new((key & 0xffff) as usize);
            let dist = topo.distance(local, node);
            if dist != prev_dist {
                load[node.index()] += 1;
            }
            prev_dist = dist;
            entry(local, len, node);
            len += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::NodeInfo;

    /// Every node's order, padded with -1.
    fn build<const N: usize>(
        d: &[u8],
        cpus: &[bool],
        mem: &[bool],
        opts: FallbackOptions,
    ) -> [[i8; N]; N] {
        let infos: [NodeInfo; N] = core::array::from_fn(|i| NodeInfo {
            has_cpus: cpus[i],
            has_memory: mem[i],
            ..NodeInfo::default()
        });
        let t = Topology::new(d, &infos).unwrap();
        let states = NodeStates {
            memory: t.memory_nodes(),
            cpus: t.cpu_nodes(),
        };
        let (mut ids, mut lens, mut load, mut keys) =
            ([NodeId::default(); 16], [0u16; N], [0u32; N], [0u64; N]);
        let mut table = FallbackTable::new(N, &mut ids, &mut lens).unwrap();
        build_fallback(
            &t,
            &states,
            opts,
            &mut Scratch {
                load: &mut load,
                keys: &mut keys,
            },
            &mut table,
        );
        core::array::from_fn(|i| {
            let row = table.order(NodeId::new(i));
            core::array::from_fn(|j| row.get(j).map_or(-1, |n| n.index() as i8))
        })
    }

    const AMD: [u8; 16] = [
        10, 12, 32, 32, 12, 10, 32, 32, 32, 32, 10, 12, 32, 32, 12, 10,
    ];

    #[test]
    fn amd_4node_post_fix_order() {
        let rows = build::<4>(&AMD, &[true; 4], &[true; 4], FallbackOptions::default());
        assert_eq!(
            rows,
            [[0, 1, 2, 3], [1, 0, 3, 2], [2, 3, 0, 1], [3, 2, 1, 0]]
        );
    }

    #[test]
    fn memoryless_node_is_left_out_everywhere() {
        let rows = build::<4>(
            &AMD,
            &[true; 4],
            &[true, false, true, true],
            FallbackOptions::default(),
        );
        assert_eq!(
            rows,
            [[0, 2, 3, -1], [0, 3, 2, -1], [2, 3, 0, -1], [3, 2, 0, -1]]
        );
    }

    #[test]
    fn boot_order_drops_cpu_penalty() {
        let d = [
            10, 20, 21, 21, 20, 10, 21, 21, 21, 21, 10, 20, 21, 21, 20, 10,
        ];
        let cpus = [true, true, false, false];
        let rows = build::<4>(&d, &cpus, &[true; 4], FallbackOptions::default());
        assert_eq!(rows[1], [1, 3, 2, 0]);
        let boot = build::<4>(
            &d,
            &cpus,
            &[true; 4],
            FallbackOptions {
                linux_boot_order: true,
            },
        );
        assert_eq!(boot[1], [1, 0, 3, 2]);
    }

    #[test]
    fn nodes_at_255_are_ordered_like_any_other() {
        // The orders Linux 6.12 printed at boot (as if no node had CPUs) for these distances:
        // `Fallback order for Node 0: 0 2 1` and `Fallback order for Node 1: 1 2 0`.
        let d = [10, 255, 30, 255, 10, 254, 30, 254, 10];
        let boot = build::<3>(
            &d,
            &[true; 3],
            &[true; 3],
            FallbackOptions {
                linux_boot_order: true,
            },
        );
        assert_eq!(boot[..2], [[0, 2, 1], [1, 2, 0]]);
        // A memoryless node whose nodes with memory are all at 255 still falls back to them.
        let d = [
            10, 255, 20, 255, 255, 10, 20, 21, 20, 20, 10, 20, 255, 21, 20, 10,
        ];
        let rows = build::<4>(
            &d,
            &[true; 4],
            &[false, true, false, true],
            FallbackOptions::default(),
        );
        assert_eq!(rows[0], [1, 3, -1, -1]);
    }

    #[test]
    fn display_is_boot_log_format() {
        // Row 1 is `ids[2..4]`.
        let mut ids = [0, 0, 1, 0].map(NodeId::new);
        let mut lens = [0u16; 2];
        let t = FallbackTable::new(2, &mut ids, &mut lens).unwrap();
        t.lens[1] = 2;
        let mut s: heapless::String<64> = heapless::String::new();
        fmt::write(&mut s, format_args!("{}", t.display(NodeId::new(1)))).unwrap();
        assert_eq!(s.as_str(), "Fallback order for Node 1: 1 0");
    }

    /// promises.md lists one panic of `build_fallback`: "storage for fewer nodes than the
    /// topology". A table with room for more nodes must build (its extra rows empty).
    #[test]
    fn a_table_for_more_nodes_than_the_topology_builds() {
        let infos = [NodeInfo {
            has_cpus: true,
            has_memory: true,
            ..NodeInfo::default()
        }; 2];
        let t = Topology::new(&[10, 20, 20, 10], &infos).unwrap();
        let states = NodeStates {
            memory: t.memory_nodes(),
            cpus: t.cpu_nodes(),
        };
        let (mut ids, mut lens, mut load, mut keys) =
            ([NodeId::default(); 9], [0u16; 3], [0u32; 3], [0u64; 3]);
        let mut table = FallbackTable::new(3, &mut ids, &mut lens).unwrap();
        build_fallback(
            &t,
            &states,
            FallbackOptions::default(),
            &mut Scratch {
                load: &mut load,
                keys: &mut keys,
            },
            &mut table,
        );
        assert_eq!(table.order(NodeId::new(0)), [0, 1].map(NodeId::new));
        assert_eq!(table.order(NodeId::new(1)), [1, 0].map(NodeId::new));
        assert!(table.order(NodeId::new(2)).is_empty());
    }
}
