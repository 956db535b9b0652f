//! The invariant walk over the whole machine.
#![deny(unsafe_code)]

use super::Machine;
use crate::error::InvariantError;
use crate::topology::{MAX_NODES, NodeId};

impl<'a> Machine<'a> {
    /// Walks every free list and counter of every zone, every per-CPU cache, and the layout.
    ///
    /// # Errors
    /// The first inconsistency found: a bug in numaframe, never a caller mistake.
    pub fn check_invariants(&self) -> Result<(), InvariantError> {
        self.caches.check()?;
        // The hotplug lock keeps the layout still while it is compared with the zones.
        let staged = self.layout.stage();
        let mut row = [NodeId::default(); MAX_NODES];
        for node in self.nodes {
            node.check(self.caches.len())?;
            let has = node.managed_pages() > 0;
            if has != staged.states.memory.contains(node.id())
                || has != self.layout.memory_nodes().contains(node.id())
            {
                return Err(InvariantError::Counter { node: node.id() });
            }
            let published = self.layout.copy_order(node.id(), &mut row);
            let order = staged.order(node.id());
            if order.iter().any(|n| !staged.states.memory.contains(*n))
                || row[..published] != *order
            {
                return Err(InvariantError::Counter { node: node.id() });
            }
        }
        Ok(())
    }
}
