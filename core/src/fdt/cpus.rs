//! CPU nodes: the children of `/cpus` with `device_type = "cpu"`, and the node each belongs to.
#![deny(unsafe_code)]

use super::error::FdtError;
use super::tree::{Tree, Visit};
use super::value;
use crate::topology::NodeId;

/// Calls `f` with the node of each available CPU under `cpus` (the `/cpus` node), in tree
/// order: its `numa-node-id`, or node 0 without one (Linux's `early_map_cpu_to_node`).
pub(super) fn for_each_cpu<'d>(
    tree: &Tree<'d>,
    cpus: &Visit<'d>,
    mut f: impl FnMut(Result<NodeId, FdtError>),
) -> Result<(), FdtError> {
    tree.children(cpus, |cpu| {
        let p = tree.props(&cpu)?;
        if !value::is(p.device_type, "cpu") || !value::available(p.status) {
            return Ok(());
        }
        f(match p.node_id {
            Some(v) => value::node_id(tree.dtb, v),
            None => Ok(NodeId::new(0)),
        });
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::super::parse;
    use super::super::test_tree::{G, Out, machine, n};

    #[test]
    fn cpus_in_tree_order_and_without_an_id_on_node_0() {
        // `/cpus` also holds a `cpu-map`, which is not a CPU.
        let dtb = machine(&[(Some(0), G, G)], &[Some(3), None, Some(1)], None, None);
        let mut o = Out::new(4, 1, 4);
        let mut t = o.topo();
        parse(&dtb, &mut t).unwrap();
        assert_eq!(t.cpus(), &[n(3), n(0), n(1)]);
    }
}
