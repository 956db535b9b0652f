//! CPU nodes: the children of `/cpus` that Linux takes for CPUs, and the node each belongs to.
#![deny(unsafe_code)]

use super::error::FdtError;
use super::tree::{Tree, Visit};
use super::value;
use crate::topology::NodeId;

/// Calls `f` with the node of each CPU under `cpus` (the `/cpus` node), in tree order: its
/// `numa-node-id`, or node 0 without one (Linux's `early_map_cpu_to_node`).
///
/// The CPUs are the children Linux's `for_each_of_cpu_node` visits: named `cpu` or with
/// `device_type = "cpu"`, less those whose `status` is `"fail"` or `"fail-…"`. A `"disabled"`
/// CPU counts: the devicetree specification calls it quiescent, and its enable-method starts it.
pub(super) fn for_each_cpu<'d>(
    tree: &Tree<'d>,
    cpus: &Visit<'d>,
    mut f: impl FnMut(Result<NodeId, FdtError>),
) -> Result<(), FdtError> {
    tree.children(cpus, |cpu| {
        let p = tree.props(&cpu)?;
        let is_cpu = cpu.name == "cpu" || value::is(p.device_type, "cpu");
        if !is_cpu || value::failed(p.status) {
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

    #[test]
    fn cpus_are_the_children_linux_iterates_disabled_included() {
        // Linux's `for_each_of_cpu_node` (`of_get_next_cpu_node`, drivers/of/base.c), which
        // `of_numa_parse_cpu_nodes` and arm64's `of_parse_and_init_cpus` walk: a child of
        // `/cpus` is a CPU if its name is `cpu` or its `device_type` is `"cpu"`, and only a CPU
        // whose `status` is `"fail"` or `"fail-…"` is skipped. A `"disabled"` CPU is a quiescent
        // CPU (devicetree specification, CPU node `status`) that the enable-method starts.
        use super::super::test_tree::{TestNode, blob, cells, string};
        let cpu = |name: &'static str, typed: bool, status: Option<&str>, node: u32| {
            let mut c = TestNode::new(name).prop("numa-node-id", cells(&[node]));
            if typed {
                c = c.prop("device_type", string("cpu"));
            }
            if let Some(s) = status {
                c = c.prop("status", string(s));
            }
            c
        };
        let memory = |base: u32, node: u32| {
            TestNode::new("memory@0")
                .prop("device_type", string("memory"))
                .prop("reg", cells(&[0, base, 0, 1 << 30]))
                .prop("numa-node-id", cells(&[node]))
        };
        let root = TestNode::new("")
            .prop("#address-cells", cells(&[2]))
            .prop("#size-cells", cells(&[2]))
            .child(memory(1 << 30, 0))
            .child(memory(2 << 30, 1))
            .child(
                TestNode::new("cpus")
                    .child(cpu("cpu@0", true, None, 0))
                    .child(cpu("cpu@1", true, Some("disabled"), 1))
                    .child(cpu("cpu@2", true, Some("fail"), 0))
                    .child(cpu("cpu@3", true, Some("fail-sss"), 0))
                    .child(cpu("cpu@4", false, Some("okay"), 1))
                    .child(cpu("idle-states", false, None, 0)),
            );
        let dtb = blob(&root, &[]);
        let mut o = Out::new(2, 2, 8);
        let mut t = o.topo();
        parse(&dtb, &mut t).unwrap();
        assert_eq!(t.cpus(), &[n(0), n(1), n(1)]);
        assert!(
            t.infos()[1].has_cpus,
            "node 1's CPUs are disabled or untyped, not absent"
        );
    }

    #[test]
    fn the_cpus_node_is_walked_whatever_its_status() {
        // Linux's `of_get_next_cpu_node` finds `/cpus` by path (`of_find_node_by_path`), which
        // looks at no `status`: the CPUs below a `/cpus` marked "disabled" are still CPUs.
        use super::super::test_tree::{TestNode, blob, cells, string};
        let root = TestNode::new("")
            .prop("#address-cells", cells(&[2]))
            .prop("#size-cells", cells(&[2]))
            .child(
                TestNode::new("memory@0")
                    .prop("device_type", string("memory"))
                    .prop("reg", cells(&[0, 1 << 30, 0, 1 << 30])),
            )
            .child(
                TestNode::new("cpus")
                    .prop("status", string("disabled"))
                    .child(TestNode::new("cpu@0").prop("device_type", string("cpu")))
                    .child(TestNode::new("cpu@1").prop("device_type", string("cpu"))),
            );
        let dtb = blob(&root, &[]);
        let mut o = Out::new(1, 1, 4);
        let mut t = o.topo();
        parse(&dtb, &mut t).unwrap();
        assert_eq!(t.cpus(), &[n(0), n(0)]);
    }
}
