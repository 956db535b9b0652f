//! NUMA topology: node ids, node masks, the SLIT distance table and node states.
//!
//! A [`Topology`] borrows its tables from the caller, so describing a 1024-node machine needs no
//! heap: the hosted shim keeps them in `Vec`s, a unikernel in a static or in boot memory.
#![deny(unsafe_code)]

use core::fmt;

/// The largest number of nodes numaframe handles (Linux's `CONFIG_NODES_SHIFT=10`).
pub const MAX_NODES: usize = 1024;
/// SLIT distance of a node to itself.
pub const LOCAL_DISTANCE: u8 = 10;
/// The SLIT distance ACPI calls "unreachable".
///
/// Linux gives it no meaning of its own, and neither does the fallback order: it is the largest
/// distance, and [`build_fallback`](crate::zonelist::build_fallback) orders a node at 255 by the
/// same rule as any other. Where numaframe itself picks nodes by nearness, an unreachable node is
/// never near: [`Topology::nearest_nodes`] leaves it out, and so [`Topology::package_of`] never
/// puts a CPU-less node in the package of a CPU node it cannot reach.
pub const UNREACHABLE: u8 = 255;

const MASK_WORDS: usize = MAX_NODES / 64;

/// A NUMA node id, `0..MAX_NODES`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[repr(transparent)]
pub struct NodeId(u16);

impl NodeId {
    /// The node `n`, or `None` if `n >= MAX_NODES`.
    pub const fn try_new(n: usize) -> Option<NodeId> {
        if n < MAX_NODES {
            Some(NodeId(n as u16))
        } else {
            None
        }
    }
    /// The node `n`.
    ///
    /// # Panics
    /// If `n >= MAX_NODES`; use [`NodeId::try_new`] for untrusted input.
    pub const fn new(n: usize) -> NodeId {
        match Self::try_new(n) {
            Some(id) => id,
            None => panic!("node id out of range"),
        }
    }
    /// The id as an index.
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Debug for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "N{}", self.0)
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A set of nodes with room for all [`MAX_NODES`], without a heap (128 bytes).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct NodeMask([u64; MASK_WORDS]);

impl Default for NodeMask {
    fn default() -> Self {
        Self::EMPTY
    }
}

impl NodeMask {
    /// The empty set.
    pub const EMPTY: NodeMask = NodeMask([0; MASK_WORDS]);

    /// The set `{0, 1, …, n-1}` (capped at [`MAX_NODES`]).
    pub fn first_n(n: usize) -> NodeMask {
        let mut m = NodeMask::EMPTY;
        for i in 0..n.min(MAX_NODES) {
            m.insert(NodeId(i as u16));
        }
        m
    }
    /// The set holding only `node`.
    pub fn single(node: NodeId) -> NodeMask {
        let mut m = NodeMask::EMPTY;
        m.insert(node);
        m
    }
    /// The set of the given nodes.
    pub fn from_nodes(nodes: impl IntoIterator<Item = NodeId>) -> NodeMask {
        let mut m = NodeMask::EMPTY;
        for n in nodes {
            m.insert(n);
        }
        m
    }
    /// Adds `node`; returns `true` if it was not in the set.
    pub fn insert(&mut self, node: NodeId) -> bool {
        let (w, b) = (node.index() / 64, node.index() % 64);
        let was = self.0[w] & (1 << b) != 0;
        self.0[w] |= 1 << b;
        !was
    }
    /// Removes `node`; returns `true` if it was in the set.
    pub fn remove(&mut self, node: NodeId) -> bool {
        let (w, b) = (node.index() / 64, node.index() % 64);
        let was = self.0[w] & (1 << b) != 0;
        self.0[w] &= !(1 << b);
        was
    }
    /// `true` if `node` is in the set.
    pub const fn contains(&self, node: NodeId) -> bool {
        self.0[node.index() / 64] & (1 << (node.index() % 64)) != 0
    }
    /// Number of nodes in the set.
    pub fn count(&self) -> usize {
        self.0.iter().map(|w| w.count_ones() as usize).sum()
    }
    /// `true` if the set is empty.
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|&w| w == 0)
    }
    /// The lowest node in the set.
    pub fn first(&self) -> Option<NodeId> {
        self.next_from(0)
    }
    /// The lowest node in the set with id `>= from`.
    fn next_from(&self, from: usize) -> Option<NodeId> {
        if from >= MAX_NODES {
            return None;
        }
        let mut w = from / 64;
        let mut word = self.0[w] & (!0u64 << (from % 64));
        loop {
            if word != 0 {
                return Some(NodeId((w * 64 + word.trailing_zeros() as usize) as u16));
            }
            w += 1;
            if w == MASK_WORDS {
                return None;
            }
            word = self.0[w];
        }
    }
    /// How many nodes of the set are below `node`: the position `node` has, or would have, in
    /// [`NodeMask::iter`].
    pub fn rank(&self, node: NodeId) -> usize {
        let (w, b) = (node.index() / 64, node.index() % 64);
        let below: usize = self.0[..w].iter().map(|x| x.count_ones() as usize).sum();
        below + (self.0[w] & ((1u64 << b) - 1)).count_ones() as usize
    }
    /// The `k`-th node of the set in ascending order, counting from 0, or `None` if the set has
    /// `k` nodes or fewer. The inverse of [`NodeMask::rank`] on the set's nodes.
    pub fn nth(&self, mut k: usize) -> Option<NodeId> {
        for (w, &word) in self.0.iter().enumerate() {
            let ones = word.count_ones() as usize;
            if k < ones {
                let mut x = word;
                for _ in 0..k {
                    x &= x - 1;
                }
                return Some(NodeId((w * 64 + x.trailing_zeros() as usize) as u16));
            }
            k -= ones;
        }
        None
    }
    /// The next node in the set after `node`, wrapping around (Linux's `next_node_in`).
    /// `None` only if the set is empty.
    pub fn next_after_wrapping(&self, node: NodeId) -> Option<NodeId> {
        self.next_from(node.index() + 1).or_else(|| self.first())
    }
    /// The intersection of two sets.
    pub fn and(&self, other: &NodeMask) -> NodeMask {
        let mut m = *self;
        for (a, b) in m.0.iter_mut().zip(other.0.iter()) {
            *a &= *b;
        }
        m
    }
    /// The union of two sets.
    pub fn or(&self, other: &NodeMask) -> NodeMask {
        let mut m = *self;
        for (a, b) in m.0.iter_mut().zip(other.0.iter()) {
            *a |= *b;
        }
        m
    }
    /// The set's bit words, node `64 * i + b` in bit `b` of word `i`.
    pub(crate) fn words(&self) -> &[u64; MASK_WORDS] {
        &self.0
    }
    /// The set with the given bit words (see [`NodeMask::words`]).
    pub(crate) fn from_words(words: [u64; MASK_WORDS]) -> NodeMask {
        NodeMask(words)
    }
    /// The nodes in the set, ascending.
    pub fn iter(&self) -> NodeMaskIter<'_> {
        NodeMaskIter {
            mask: self,
            next: 0,
        }
    }
}

impl fmt::Debug for NodeMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

/// Iterator over the nodes of a [`NodeMask`], ascending.
#[derive(Debug, Clone)]
pub struct NodeMaskIter<'a> {
    mask: &'a NodeMask,
    next: usize,
}

impl Iterator for NodeMaskIter<'_> {
    type Item = NodeId;
    fn next(&mut self) -> Option<NodeId> {
        let n = self.mask.next_from(self.next)?;
        self.next = n.index() + 1;
        Some(n)
    }
}

impl<'a> IntoIterator for &'a NodeMask {
    type Item = NodeId;
    type IntoIter = NodeMaskIter<'a>;
    fn into_iter(self) -> NodeMaskIter<'a> {
        self.iter()
    }
}

/// What the platform says about one node. Every field is an explicit input: numaframe never
/// infers a node state from timing or from what memory it happens to be given.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeInfo {
    /// The node has CPUs (Linux's `N_CPU`). CPU-less nodes (CXL, HBM) are preferred slightly in
    /// fallback, exactly as Linux's `PENALTY_FOR_NODE_WITH_CPUS` does.
    pub has_cpus: bool,
    /// The node has memory (Linux's `N_MEMORY`). A node without memory never appears in a
    /// fallback list until memory is hot-added to it.
    pub has_memory: bool,
    /// The physical package the node sits in, if the platform knows it.
    pub socket: Option<u16>,
    /// For a CPU-less node, the CPU node that owns it (its initiator).
    pub initiator: Option<NodeId>,
    /// Memory bandwidth of the node in GB/s, the input to automatic interleave weights.
    pub bandwidth_gbps: Option<u32>,
}

/// `true` if `distance` from `from` to `to` may stand in a [`Topology`]: [`LOCAL_DISTANCE`] from
/// a node to itself and at least that to any other node. Linux's firmware readers ask for more
/// than 10 between nodes (ACPI's `slit_valid`, the device tree's
/// `of_numa_parse_distance_map_v1`), while its `numa_set_distance` refuses only a diagonal
/// other than 10 and takes anything between nodes, below 10 too; `numa=fake` builds tables with
/// 10 between nodes (the `fake-64` preset models one). numaframe takes 10 and above, so that no
/// other node is nearer than a node to itself.
pub fn valid_distance(from: NodeId, to: NodeId, distance: u8) -> bool {
    if from == to {
        distance == LOCAL_DISTANCE
    } else {
        distance >= LOCAL_DISTANCE
    }
}

/// `true` if `distance` from `from` to `to` is allowed in a firmware distance table (ACPI's SLIT,
/// a device tree's `distance-map`): [`LOCAL_DISTANCE`] on the diagonal and more than that
/// elsewhere. Linux refuses a whole firmware table that breaks this (ACPI's `slit_valid`, the
/// device tree's `of_numa_parse_distance_map`); every firmware reader of numaframe checks its
/// table with this one rule before it builds a [`Topology`].
pub fn valid_firmware_distance(from: NodeId, to: NodeId, distance: u8) -> bool {
    valid_distance(from, to, distance) && (from == to || distance > LOCAL_DISTANCE)
}

/// A topology table breaks a rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum TopologyError {
    /// The topology has no node.
    NoNodes,
    /// More than [`MAX_NODES`] nodes.
    TooManyNodes {
        /// Number of nodes given.
        nodes: usize,
    },
    /// The distance table is not `nodes × nodes`.
    DistanceTableSize {
        /// Number of nodes.
        nodes: usize,
        /// Number of distance entries given.
        entries: usize,
    },
    /// A distance breaks the rules of [`valid_distance`] (10 on the diagonal, 10..=255
    /// elsewhere).
    BadDistance {
        /// Row.
        from: NodeId,
        /// Column.
        to: NodeId,
        /// The offending value.
        distance: u8,
    },
    /// A node with CPUs names an initiator.
    InitiatorOnCpuNode {
        /// The node.
        node: NodeId,
    },
    /// An initiator that does not exist or has no CPUs.
    BadInitiator {
        /// The CPU-less node.
        node: NodeId,
        /// The initiator it names.
        initiator: NodeId,
    },
}

impl fmt::Display for TopologyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            TopologyError::NoNodes => write!(f, "topology has no nodes"),
            TopologyError::TooManyNodes { nodes } => {
                write!(f, "{nodes} nodes, at most 1024 supported")
            }
            TopologyError::DistanceTableSize { nodes, entries } => {
                write!(
                    f,
                    "distance table has {entries} entries, {nodes} nodes need {}",
                    nodes * nodes
                )
            }
            TopologyError::BadDistance { from, to, distance } => {
                write!(
                    f,
                    "distance {from}->{to} is {distance}: a topology needs 10 on the diagonal and 10..=255 elsewhere"
                )
            }
            TopologyError::InitiatorOnCpuNode { node } => {
                write!(f, "node {node} has CPUs but names an initiator")
            }
            TopologyError::BadInitiator { node, initiator } => {
                write!(
                    f,
                    "node {node} names initiator {initiator}, which is not a node with CPUs"
                )
            }
        }
    }
}

impl core::error::Error for TopologyError {}

/// A validated NUMA topology borrowed from caller-owned tables.
///
/// Invariants (checked by [`Topology::new`]):
/// - `1 <= nodes.len() <= MAX_NODES` and `distances.len() == nodes.len()^2`;
/// - every distance passes [`valid_distance`]: [`LOCAL_DISTANCE`] on the diagonal, at least
///   that elsewhere;
/// - an initiator names an existing node with CPUs, and only CPU-less nodes have one.
#[derive(Clone, Copy, Debug)]
pub struct Topology<'a> {
    distances: &'a [u8],
    nodes: &'a [NodeInfo],
}

impl<'a> Topology<'a> {
    /// Validates the tables: row `i` of `distances` (length `n*n`, row-major) holds the distances
    /// from node `i`, and `nodes[i]` describes node `i`.
    ///
    /// # Errors
    /// A [`TopologyError`] naming the first rule the tables break.
    pub fn new(distances: &'a [u8], nodes: &'a [NodeInfo]) -> Result<Self, TopologyError> {
        let n = nodes.len();
        if n == 0 {
            return Err(TopologyError::NoNodes);
        }
        if n > MAX_NODES {
            return Err(TopologyError::TooManyNodes { nodes: n });
        }
        if distances.len() != n * n {
            return Err(TopologyError::DistanceTableSize {
                nodes: n,
                entries: distances.len(),
            });
        }
        for (i, row) in distances.chunks_exact(n).enumerate() {
            for (j, &d) in row.iter().enumerate() {
                let (from, to) = (NodeId(i as u16), NodeId(j as u16));
                if !valid_distance(from, to, d) {
                    return Err(TopologyError::BadDistance {
                        from,
                        to,
                        distance: d,
                    });
                }
            }
        }
        for (i, info) in nodes.iter().enumerate() {
            if let Some(init) = info.initiator {
                if info.has_cpus {
                    return Err(TopologyError::InitiatorOnCpuNode {
                        node: NodeId(i as u16),
                    });
                }
                match nodes.get(init.index()) {
                    Some(target) if target.has_cpus => {}
                    _ => {
                        return Err(TopologyError::BadInitiator {
                            node: NodeId(i as u16),
                            initiator: init,
                        });
                    }
                }
            }
        }
        Ok(Self { distances, nodes })
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }
    /// Always `false`: a topology has at least one node.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
    /// The node ids `0..len()`.
    pub fn node_ids(&self) -> impl ExactSizeIterator<Item = NodeId> + Clone + '_ {
        (0..self.nodes.len()).map(|i| NodeId(i as u16))
    }
    /// `true` if `node` exists in this topology.
    pub fn contains(&self, node: NodeId) -> bool {
        node.index() < self.nodes.len()
    }
    /// The SLIT distance from `from` to `to`.
    ///
    /// # Panics
    /// If either node is not in the topology.
    pub fn distance(&self, from: NodeId, to: NodeId) -> u8 {
        let n = self.nodes.len();
        assert!(
            from.index() < n && to.index() < n,
            "node outside the topology"
        );
        self.distances[from.index() * n + to.index()]
    }
    /// What the platform said about `node`.
    ///
    /// # Panics
    /// If `node` is not in the topology.
    pub fn info(&self, node: NodeId) -> &NodeInfo {
        &self.nodes[node.index()]
    }
    /// All node descriptions, indexed by node id.
    pub fn infos(&self) -> &'a [NodeInfo] {
        self.nodes
    }
    /// The raw distance table, row-major.
    pub fn distances(&self) -> &'a [u8] {
        self.distances
    }
    /// The nodes that have CPUs.
    pub fn cpu_nodes(&self) -> NodeMask {
        NodeMask::from_nodes(self.node_ids().filter(|n| self.info(*n).has_cpus))
    }
    /// The nodes that have memory.
    pub fn memory_nodes(&self) -> NodeMask {
        NodeMask::from_nodes(self.node_ids().filter(|n| self.info(*n).has_memory))
    }
    /// The package (physical socket) `node` belongs to, as an opaque key: equal keys mean the
    /// same package. A CPU node's package is its socket, or a package of its own if it has none;
    /// a CPU-less node belongs to its initiator's package, or failing that to its own socket,
    /// or failing that to the package of its nearest CPU node (the lowest id on a tie; a CPU
    /// node at [`UNREACHABLE`] is not near, see [`Topology::nearest_nodes`]).
    /// `None` for a CPU-less node with none of these (every CPU node is at [`UNREACHABLE`]), so
    /// socket-aware interleave counts it in no CPU's package; and `None` for a node outside the
    /// topology.
    pub fn package_of(&self, node: NodeId) -> Option<u32> {
        let cpu_package = |n: NodeId| {
            self.info(n)
                .socket
                .map_or(u32::from(u16::MAX) + 1 + n.index() as u32, u32::from)
        };
        if !self.contains(node) {
            return None;
        }
        let info = self.info(node);
        if info.has_cpus {
            return Some(cpu_package(node));
        }
        if let Some(init) = info.initiator {
            return Some(cpu_package(init));
        }
        if let Some(s) = info.socket {
            return Some(u32::from(s));
        }
        self.nearest_nodes(node, &self.cpu_nodes())
            .first()
            .map(cpu_package)
    }

    /// All nodes of `mask` at the minimum distance from `node` (Linux's `nearest_node` family,
    /// but returning every tie). Nodes outside the topology are ignored, and so are nodes at
    /// [`UNREACHABLE`]: an unreachable node is not near, even when it is the only one in `mask`,
    /// so the result is empty when every node of `mask` is unreachable from `node`. (The
    /// fallback order is another matter: it lists nodes at 255 as Linux does.)
    pub fn nearest_nodes(&self, node: NodeId, mask: &NodeMask) -> NodeMask {
        if !self.contains(node) {
            return NodeMask::EMPTY;
        }
        let candidates = || {
            mask.iter()
                .filter(|n| self.contains(*n))
                .filter(|n| self.distance(node, *n) != UNREACHABLE)
        };
        let Some(best) = candidates().map(|n| self.distance(node, n)).min() else {
            return NodeMask::EMPTY;
        };
        NodeMask::from_nodes(candidates().filter(|n| self.distance(node, *n) == best))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(cpus: bool) -> NodeInfo {
        NodeInfo {
            has_cpus: cpus,
            has_memory: true,
            ..NodeInfo::default()
        }
    }

    #[test]
    fn mask_basics() {
        let mut m = NodeMask::EMPTY;
        assert!(m.insert(NodeId::new(3)));
        assert!(!m.insert(NodeId::new(3)));
        m.insert(NodeId::new(1023));
        m.insert(NodeId::new(64));
        assert_eq!(m.count(), 3);
        let v: heapless::Vec<usize, 4> = m.iter().map(NodeId::index).collect();
        assert_eq!(&v[..], &[3, 64, 1023]);
        assert_eq!(
            m.next_after_wrapping(NodeId::new(1023)),
            Some(NodeId::new(3))
        );
        assert_eq!(m.next_after_wrapping(NodeId::new(3)), Some(NodeId::new(64)));
        assert!(m.remove(NodeId::new(64)));
        assert_eq!(NodeMask::EMPTY.next_after_wrapping(NodeId::new(0)), None);
        assert_eq!(NodeMask::first_n(MAX_NODES + 5).count(), MAX_NODES);
    }

    #[test]
    fn mask_rank_and_nth() {
        let s = NodeMask::from_nodes([0, 3, 63, 64, 200, 1023].map(NodeId::new));
        assert_eq!(s.nth(0), Some(NodeId::new(0)));
        assert_eq!(s.nth(3), Some(NodeId::new(64)));
        assert_eq!(s.nth(5), Some(NodeId::new(1023)));
        assert_eq!(s.nth(6), None);
        assert_eq!(s.rank(NodeId::new(0)), 0);
        assert_eq!(s.rank(NodeId::new(64)), 3);
        assert_eq!(s.rank(NodeId::new(65)), 4);
        assert_eq!(s.rank(NodeId::new(1023)), 5);
        for (k, node) in s.iter().enumerate() {
            assert_eq!((s.rank(node), s.nth(k)), (k, Some(node)));
        }
        assert_eq!(NodeMask::EMPTY.nth(0), None);
        assert_eq!(NodeMask::EMPTY.rank(NodeId::new(1023)), 0);
    }

    #[test]
    fn validation() {
        let nodes = [info(true), info(false)];
        assert!(Topology::new(&[10, 20, 20, 10], &nodes).is_ok());
        assert_eq!(
            Topology::new(&[10, 20, 20], &nodes).unwrap_err(),
            TopologyError::DistanceTableSize {
                nodes: 2,
                entries: 3
            }
        );
        assert!(matches!(
            Topology::new(&[11, 20, 20, 10], &nodes),
            Err(TopologyError::BadDistance { distance: 11, .. })
        ));
        assert!(matches!(
            Topology::new(&[10, 9, 20, 10], &nodes),
            Err(TopologyError::BadDistance { distance: 9, .. })
        ));
        // A remote 10 is legal in a topology (numa=fake builds it) but not in a firmware table.
        assert!(Topology::new(&[10, 10, 10, 10], &nodes).is_ok());
        assert!(Topology::new(&[10, 11, 255, 10], &nodes).is_ok());
        let (a, b) = (NodeId::new(0), NodeId::new(1));
        assert!(valid_distance(a, b, 10) && !valid_firmware_distance(a, b, 10));
        assert!(valid_firmware_distance(a, b, 11) && valid_firmware_distance(a, a, 10));
        assert!(!valid_firmware_distance(a, a, 11) && !valid_distance(a, b, 9));
        assert_eq!(Topology::new(&[], &[]).unwrap_err(), TopologyError::NoNodes);
        let bad_init = [
            info(true),
            NodeInfo {
                initiator: Some(NodeId::new(1)),
                ..info(false)
            },
        ];
        assert!(matches!(
            Topology::new(&[10, 20, 20, 10], &bad_init),
            Err(TopologyError::BadInitiator { .. })
        ));
        let init_on_cpu = [
            NodeInfo {
                initiator: Some(NodeId::new(0)),
                ..info(true)
            },
            info(true),
        ];
        assert!(matches!(
            Topology::new(&[10, 20, 20, 10], &init_on_cpu),
            Err(TopologyError::InitiatorOnCpuNode { .. })
        ));
    }

    #[test]
    fn nearest() {
        let nodes = [info(true), info(true), info(false), info(false)];
        let d = [
            10, 21, 14, 14, 21, 10, 24, 14, 14, 24, 10, 34, 14, 14, 34, 10,
        ];
        let t = Topology::new(&d, &nodes).unwrap();
        let all = NodeMask::first_n(4);
        let mut others = all;
        others.remove(NodeId::new(0));
        assert_eq!(
            t.nearest_nodes(NodeId::new(0), &others),
            NodeMask::from_nodes([NodeId::new(2), NodeId::new(3)])
        );
        assert_eq!(
            t.nearest_nodes(NodeId::new(0), &all),
            NodeMask::single(NodeId::new(0))
        );
        assert!(t.nearest_nodes(NodeId::new(9), &all).is_empty());
    }

    #[test]
    fn unreachable_nodes_are_not_near() {
        // Node 2 (CPU-less) reaches CPU node 1 only at 254 and CPU node 0 not at all; node 3
        // (CPU-less) reaches no CPU node.
        let nodes = [info(true), info(true), info(false), info(false)];
        #[rustfmt::skip]
        let d = [
            10, 20, 255, 255,
            20, 10, 254, 255,
            255, 254, 10, 20,
            255, 255, 20, 10,
        ];
        let t = Topology::new(&d, &nodes).unwrap();
        let n = NodeId::new;
        let cpus = t.cpu_nodes();
        assert_eq!(t.nearest_nodes(n(2), &cpus), NodeMask::single(n(1)));
        assert!(t.nearest_nodes(n(3), &cpus).is_empty());
        assert!(t.nearest_nodes(n(0), &NodeMask::single(n(3))).is_empty());
        assert_eq!(t.package_of(n(2)), t.package_of(n(1)));
        assert_ne!(t.package_of(n(2)), t.package_of(n(0)));
        assert_eq!(t.package_of(n(3)), None);
        // A socket or an initiator still gives a package.
        let with_initiator = [
            info(true),
            info(true),
            info(false),
            NodeInfo {
                initiator: Some(n(0)),
                ..info(false)
            },
        ];
        let t = Topology::new(&d, &with_initiator).unwrap();
        assert_eq!(t.package_of(n(3)), t.package_of(n(0)));
    }
}
