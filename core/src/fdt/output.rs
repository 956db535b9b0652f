//! What the reader returns: the tables it fills in caller-provided storage ([`FdtTopology`]) and
//! what else it found ([`FdtInfo`]).
#![deny(unsafe_code)]

use crate::machine::MemoryRange;
use crate::topology::{NodeId, NodeInfo, Topology, TopologyError};

/// Caller-provided storage that [`parse`](super::parse) fills: the distance table, node
/// descriptions, memory ranges and the node of each CPU.
///
/// Invariant after a successful [`parse`](super::parse): `nodes() >= 1`, and the first `nodes()²`
/// distances, `nodes()` infos, `ranges().len()` ranges and `cpus().len()` CPUs are the tree's.
#[derive(Debug)]
pub struct FdtTopology<'s> {
    pub(super) distances: &'s mut [u8],
    pub(super) infos: &'s mut [NodeInfo],
    pub(super) ranges: &'s mut [MemoryRange],
    pub(super) cpus: &'s mut [NodeId],
    pub(super) nodes: usize,
    pub(super) nranges: usize,
    pub(super) ncpus: usize,
}

impl<'s> FdtTopology<'s> {
    /// Storage for up to `infos.len()` nodes (with `distances` of at least its square), the given
    /// number of memory ranges and CPUs.
    pub fn new(
        distances: &'s mut [u8],
        infos: &'s mut [NodeInfo],
        ranges: &'s mut [MemoryRange],
        cpus: &'s mut [NodeId],
    ) -> Self {
        Self {
            distances,
            infos,
            ranges,
            cpus,
            nodes: 0,
            nranges: 0,
            ncpus: 0,
        }
    }
    /// Number of nodes (0 before a successful [`parse`](super::parse)).
    pub fn nodes(&self) -> usize {
        self.nodes
    }
    /// The distance table, row-major: row `i` holds the distances from node `i`.
    pub fn distances(&self) -> &[u8] {
        &self.distances[..self.nodes * self.nodes]
    }
    /// What the tree says about each node.
    pub fn infos(&self) -> &[NodeInfo] {
        &self.infos[..self.nodes]
    }
    /// Mutable node descriptions, for what a device tree does not say (sockets, bandwidth) or
    /// for a platform that reserves all of a node's memory.
    pub fn infos_mut(&mut self) -> &mut [NodeInfo] {
        &mut self.infos[..self.nodes]
    }
    /// The memory ranges, in tree order.
    pub fn ranges(&self) -> &[MemoryRange] {
        &self.ranges[..self.nranges]
    }
    /// The node of each CPU, in tree order (the order of `/cpus`).
    pub fn cpus(&self) -> &[NodeId] {
        &self.cpus[..self.ncpus]
    }
    /// The validated topology (empty before a successful [`parse`](super::parse)).
    ///
    /// # Errors
    /// The [`TopologyError`] of [`Topology::new`]: [`TopologyError::NoNodes`] before a
    /// successful [`parse`](super::parse), and for tables edited through
    /// [`FdtTopology::infos_mut`] that break its rules.
    pub fn topology(&self) -> Result<Topology<'_>, TopologyError> {
        Topology::new(self.distances(), self.infos())
    }
}

/// What [`parse`](super::parse) found besides the topology.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FdtInfo<'d> {
    /// `totalsize` from the header: the bytes the tree occupies, to reserve.
    pub total_size: usize,
    /// `boot_cpuid_phys` from the header.
    pub boot_cpuid: u32,
    /// `/chosen/bootargs` as Linux reads it: the bytes before its first NUL, `None` if the
    /// value is empty or there is no `/chosen` (see the [module docs](super)).
    pub bootargs: Option<&'d str>,
    /// `true` if memory nodes carry `numa-node-id` (otherwise the machine is one node).
    pub numa: bool,
}
