//! What a command line asks for: the default size and, per size, a pool request.
#![deny(unsafe_code)]

use super::error::{CmdlineError, CmdlineErrorKind};
use crate::addr::HugeSize;
use crate::topology::NodeId;

/// The most entries a node list (`hugepages=0:4,1:2,…`) may hold.
pub const MAX_NODE_ENTRIES: usize = 64;

/// One entry of a node list: `count` pages on `node`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct NodeCount {
    /// The node.
    pub node: NodeId,
    /// Pages to reserve on it.
    pub count: u64,
    /// Byte offset of the entry (`1:2` in `hugepages=0:4,1:2`) in the command line, for errors
    /// found later, as by [`HugepageConfig::validate_nodes`].
    pub offset: usize,
}

/// How many pages of one size to reserve at boot.
///
/// A node list is stored inline (about 1.5 KiB), so [`PoolRequest::Balanced`] takes as much room;
/// a config holds two of these, once, at boot.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[allow(
    clippy::large_enum_variant,
    reason = "no heap to box the node list in; one config is built once at boot"
)]
pub enum PoolRequest {
    /// `hugepages=N`: `N` pages, spread round-robin by the caller over the nodes with memory.
    Balanced(u64),
    /// `hugepages=NODE:N,…`: the given count on each listed node and none on the others.
    ///
    /// From [`parse`](super::parse), the nodes are distinct and the counts sum to at most
    /// `u64::MAX`.
    PerNode(heapless::Vec<NodeCount, MAX_NODE_ENTRIES>),
}

impl PoolRequest {
    /// The number of pages asked for over all nodes (saturating at `u64::MAX`, which a request
    /// from [`parse`](super::parse) never reaches).
    pub fn total(&self) -> u64 {
        match self {
            PoolRequest::Balanced(n) => *n,
            PoolRequest::PerNode(entries) => entries
                .iter()
                .fold(0u64, |sum, e| sum.saturating_add(e.count)),
        }
    }
}

/// One value for each [`HugeSize`], without indexing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(super) struct PerSize<T> {
    size_2m: T,
    size_1g: T,
}

impl<T> PerSize<T> {
    pub(super) fn get(&self, size: HugeSize) -> &T {
        match size {
            HugeSize::Size2M => &self.size_2m,
            HugeSize::Size1G => &self.size_1g,
        }
    }
    pub(super) fn get_mut(&mut self, size: HugeSize) -> &mut T {
        match size {
            HugeSize::Size2M => &mut self.size_2m,
            HugeSize::Size1G => &mut self.size_1g,
        }
    }
}

/// The huge-page pools a command line asks for; made by [`parse`](super::parse).
///
/// [`Default`] is what an empty command line gives: default size 2 MiB, no pages.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HugepageConfig {
    pub(super) default_size: HugeSize,
    pub(super) requests: PerSize<Option<PoolRequest>>,
    /// The size the first `hugepagesz=` or `default_hugepagesz=` named: Linux registers it
    /// first.
    pub(super) first_named: Option<HugeSize>,
}

impl Default for HugepageConfig {
    fn default() -> Self {
        Self {
            default_size: HugeSize::Size2M,
            requests: PerSize::default(),
            first_named: None,
        }
    }
}

impl HugepageConfig {
    /// The default huge page size: the one `default_hugepagesz=` names, or 2 MiB.
    pub fn default_size(&self) -> HugeSize {
        self.default_size
    }
    /// The size the first `hugepagesz=` or `default_hugepagesz=` of the line names, if any.
    pub fn first_named(&self) -> Option<HugeSize> {
        self.first_named
    }
    /// What the command line asks for `size`, or `None` if no `hugepages=` applies to it.
    pub fn request(&self, size: HugeSize) -> Option<&PoolRequest> {
        self.requests.get(size).as_ref()
    }
    /// The number of pages of `size` asked for; 0 without a request.
    pub fn total(&self, size: HugeSize) -> u64 {
        self.request(size).map_or(0, PoolRequest::total)
    }
    /// Checks that every node named in a node list is below `node_count`, the number of nodes
    /// of the machine (Linux checks `node_online` at this point).
    ///
    /// # Errors
    /// [`CmdlineErrorKind::UnknownNode`] at the entry of the first such node in input order.
    pub fn validate_nodes(&self, node_count: usize) -> Result<(), CmdlineError> {
        let first_unknown = HugeSize::ALL
            .iter()
            .filter_map(|&size| match self.request(size) {
                Some(PoolRequest::PerNode(entries)) => Some(entries),
                _ => None,
            })
            .flat_map(|entries| entries.iter())
            .filter(|e| e.node.index() >= node_count)
            .map(|e| e.offset)
            .min();
        match first_unknown {
            Some(offset) => Err(CmdlineError {
                offset,
                kind: CmdlineErrorKind::UnknownNode,
            }),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::ok;
    use super::*;
    use crate::topology::MAX_NODES;
    use CmdlineErrorKind as K;

    #[test]
    fn validate_nodes_names_the_first_unknown_entry() {
        let cfg = ok("hugepagesz=1G hugepages=0:4,1:2 hugepagesz=2M hugepages=1:5");
        assert_eq!(cfg.validate_nodes(2), Ok(()));
        assert_eq!(cfg.validate_nodes(MAX_NODES), Ok(()));
        // Node 1 of 1G (byte 28) comes before node 1 of 2M (byte 56).
        assert_eq!(
            cfg.validate_nodes(1),
            Err(CmdlineError {
                offset: 28,
                kind: K::UnknownNode
            })
        );
        let cfg = ok("hugepagesz=2M hugepages=1:5 hugepagesz=1G hugepages=0:4,3:2");
        assert_eq!(
            cfg.validate_nodes(2),
            Err(CmdlineError {
                offset: 56,
                kind: K::UnknownNode
            })
        );
        assert_eq!(ok("hugepages=9").validate_nodes(0), Ok(()));
    }
}
