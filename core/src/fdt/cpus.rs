//! CPU nodes: the children of `/cpus` that Linux takes for CPUs, and the node each belongs to.
#![deny(unsafe_code)]

use super::error::FdtError;
use super::tree::{Props, Tree, Visit};
use super::value;
use crate::topology::NodeId;

/// Calls `f` with each CPU under `cpus` (the `/cpus` node), in tree order: `Some` of its own
/// `numa-node-id`, or `None` without one (then [`parent_node`] gives Linux's answer).
///
/// The CPUs are the children Linux's `for_each_of_cpu_node` visits: named `cpu` or with
/// `device_type = "cpu"`, less those whose `status` is `"fail"` or `"fail-…"`. A `"disabled"`
/// CPU counts: the devicetree specification calls it quiescent, and its enable-method starts it.
pub(super) fn for_each_cpu<'d>(
    tree: &Tree<'d>,
    cpus: &Visit<'d>,
    mut f: impl FnMut(Option<Result<NodeId, FdtError>>),
) -> Result<(), FdtError> {
    tree.children(cpus, |cpu| {
        let p = tree.props(&cpu)?;
        let is_cpu = cpu.name == "cpu" || value::is(p.device_type, "cpu");
        if !is_cpu || value::failed(p.status) {
            return Ok(());
        }
        f(p.node_id.map(|v| value::node_id(tree.dtb, v)));
        Ok(())
    })
}

/// The node a CPU without `numa-node-id` finds up its parents, as Linux's `of_node_to_nid`
/// walks them while the property is absent: that of `/cpus` (`cpus`), else that of the root
/// (`root`). `None` without either: the CPU is on node 0 (`early_map_cpu_to_node`).
///
/// Linux keeps the node only if it is possible (`node_possible`); the caller checks that
/// against the whole tree. A malformed value stops Linux's walk there, and is an error here.
pub(super) fn parent_node(
    dtb: &[u8],
    cpus: &Props<'_>,
    root: &Props<'_>,
) -> Option<Result<NodeId, FdtError>> {
    cpus.node_id
        .or(root.node_id)
        .map(|v| value::node_id(dtb, v))
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
        use super::super::test_tree::{TestNode, blob, cells, memory, root, string};
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
        let root = root()
            .child(memory(1 << 30, 1 << 30, Some(0)))
            .child(memory(2 << 30, 1 << 30, Some(1)))
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
    fn a_cpu_without_an_id_takes_the_first_id_up_its_parents_if_linux_finds_that_node_possible() {
        // arm64's `of_parse_and_init_cpus` puts each CPU on `of_node_to_nid(cpu)` through
        // `early_map_cpu_to_node` (arch/arm64/kernel/smp.c, drivers/base/arch_numa.c).
        // `of_node_to_nid` (drivers/of/of_numa.c) reads `numa-node-id` from the CPU, then from
        // `/cpus`, then from the root, for as long as it is absent; it stops at a malformed one,
        // and returns NUMA_NO_NODE unless the id it found is `node_possible`: named by a memory
        // node, by a CPU's own `numa-node-id` (`of_numa_parse_cpu_nodes`), or first in a
        // distance-map triple (`of_numa_parse_distance_map_v1`). `early_map_cpu_to_node` puts
        // NUMA_NO_NODE on node 0, and so every CPU of a machine without NUMA (`numa_off`).
        use super::super::FdtError;
        use super::super::test_tree::{TestNode, blob, cells, memory, root, string};
        use crate::topology::NodeId;
        let tree = |numa: bool,
                    root_id: Option<&[u32]>,
                    cpus: Option<&[u32]>,
                    own: &[Option<u32>],
                    matrix: &[u32]| {
            let mut root_node = root();
            if let Some(id) = root_id {
                root_node = root_node.prop("numa-node-id", cells(id));
            }
            for node in 0..2 {
                root_node = root_node.child(memory(
                    u64::from(node + 1) << 30,
                    1 << 30,
                    numa.then_some(node),
                ));
            }
            let mut cpus_node = TestNode::new("cpus");
            if let Some(id) = cpus {
                cpus_node = cpus_node.prop("numa-node-id", cells(id));
            }
            for id in own {
                let mut c = TestNode::new("cpu@0").prop("device_type", string("cpu"));
                if let Some(id) = id {
                    c = c.prop("numa-node-id", cells(&[*id]));
                }
                cpus_node = cpus_node.child(c);
            }
            root_node = root_node.child(cpus_node);
            if !matrix.is_empty() {
                root_node = root_node.child(
                    TestNode::new("distance-map")
                        .prop("compatible", string("numa-distance-map-v1"))
                        .prop("distance-matrix", cells(matrix)),
                );
            }
            blob(&root_node, &[])
        };
        let check = |dtb: &[u8], nodes: usize, cpus: &[NodeId]| {
            let mut o = Out::new(4, 2, 4);
            let mut t = o.topo();
            assert_eq!(parse(dtb, &mut t).map(|_| ()), Ok(()));
            assert_eq!((t.nodes(), t.cpus()), (nodes, cpus));
        };
        // `/cpus` first, then the root.
        check(
            &tree(true, Some(&[0]), Some(&[1]), &[Some(0), None], &[]),
            2,
            &[n(0), n(1)],
        );
        check(&tree(true, Some(&[1]), None, &[None], &[]), 2, &[n(1)]);
        // Node 2, named by nothing else, is not possible: node 0.
        check(
            &tree(true, None, Some(&[2]), &[None, Some(1)], &[]),
            2,
            &[n(0), n(1)],
        );
        // Named by another CPU's own id, or first in a triple, it is.
        check(
            &tree(true, None, Some(&[2]), &[Some(2), None], &[]),
            3,
            &[n(2), n(2)],
        );
        check(
            &tree(true, None, Some(&[2]), &[None], &[2, 0, 20]),
            3,
            &[n(2)],
        );
        // Second in a triple only, it is not.
        check(
            &tree(true, None, Some(&[2]), &[None], &[0, 2, 20]),
            3,
            &[n(0)],
        );
        // A malformed id stops the walk: Linux warns and uses node 0, numaframe refuses it as
        // it refuses a CPU's own malformed id. Without NUMA, neither matters.
        let dtb = tree(true, Some(&[1]), Some(&[]), &[None], &[]);
        assert!(matches!(
            parse(&dtb, &mut Out::new(4, 2, 4).topo()),
            Err(FdtError::BadProperty { len: 0, .. })
        ));
        check(
            &tree(false, Some(&[1]), Some(&[]), &[None, Some(1)], &[]),
            1,
            &[n(0), n(0)],
        );
    }

    #[test]
    fn a_disabled_memory_nodes_id_makes_its_node_possible_for_cpus_looking_up() {
        // Linux's `of_numa_parse_memory_nodes` (drivers/of/of_numa.c) finds memory nodes with
        // `for_each_node_by_type(np, "memory")`, which looks at no `status`, and marks the
        // `numa-node-id` of each one with a `reg` range parsed (`numa_add_memblk`, then
        // `node_set(nid, numa_nodes_parsed)`), whether or not the range is RAM
        // (`early_init_dt_scan_memory` alone skips a disabled node). So node 2, named only by a
        // disabled memory node, is possible, and a CPU without an id that finds 2 on `/cpus`
        // is on node 2 (`of_node_to_nid`, `early_map_cpu_to_node`).
        use super::super::test_tree::{TestNode, blob, cells, memory, root, string};
        let tree = root()
            .child(memory(1 << 30, 1 << 30, Some(0)))
            .child(memory(2 << 30, 1 << 30, Some(1)))
            .child(memory(3 << 30, 1 << 30, Some(2)).prop("status", string("disabled")))
            .child(
                TestNode::new("cpus")
                    .prop("numa-node-id", cells(&[2]))
                    .child(TestNode::new("cpu@0").prop("device_type", string("cpu")))
                    .child(
                        TestNode::new("cpu@1")
                            .prop("device_type", string("cpu"))
                            .prop("numa-node-id", cells(&[1])),
                    ),
            );
        let dtb = blob(&tree, &[]);
        let mut o = Out::new(4, 4, 4);
        let mut t = o.topo();
        parse(&dtb, &mut t).unwrap();
        assert_eq!((t.nodes(), t.cpus()), (3, &[n(2), n(1)][..]));
        // The disabled node's range is not memory.
        assert_eq!(t.ranges().len(), 2);
        // Without `reg`, Linux's NUMA set-up fails (`of_numa_parse_memory_nodes` needs a range
        // of every memory node with an id), which is an error here, as for an enabled node;
        // on a machine without NUMA nothing of it matters.
        for numa in [true, false] {
            let tree = root()
                .child(memory(1 << 30, 1 << 30, numa.then_some(0)))
                .child(
                    TestNode::new("memory@1")
                        .prop("device_type", string("memory"))
                        .prop("status", string("disabled"))
                        .prop("numa-node-id", cells(&[1])),
                );
            let dtb = blob(&tree, &[]);
            let got = parse(&dtb, &mut Out::new(4, 4, 4).topo()).map(|_| ());
            assert_eq!(got.is_err(), numa, "{got:?}");
        }
    }

    #[test]
    fn the_cpus_node_is_walked_whatever_its_status() {
        // Linux's `of_get_next_cpu_node` finds `/cpus` by path (`of_find_node_by_path`), which
        // looks at no `status`: the CPUs below a `/cpus` marked "disabled" are still CPUs.
        use super::super::test_tree::{TestNode, blob, memory, root, string};
        let root = root().child(memory(1 << 30, 1 << 30, None)).child(
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

    #[test]
    fn the_cpus_node_is_the_first_child_of_the_root_named_exactly_cpus() {
        // Linux's `of_get_next_cpu_node` takes `of_find_node_by_path("/cpus")`, which
        // (`__of_find_node_by_path`) compares each child's whole name, unit address included,
        // with "cpus" and returns the first that matches: a `cpus@0` is not `/cpus`, and the
        // CPUs of a second `cpus` node are not walked.
        use super::super::test_tree::{TestNode, blob, memory, root, string};
        let cpus = |name: &'static str, count: usize| {
            (0..count).fold(TestNode::new(name), |c, _| {
                c.child(TestNode::new("cpu@0").prop("device_type", string("cpu")))
            })
        };
        let tree = |first: TestNode, second: Option<TestNode>| {
            let mut root = root().child(memory(1 << 30, 1 << 30, None)).child(first);
            if let Some(s) = second {
                root = root.child(s);
            }
            blob(&root, &[])
        };
        let count = |dtb: &[u8]| {
            let mut o = Out::new(1, 1, 8);
            let mut t = o.topo();
            parse(dtb, &mut t).unwrap();
            t.cpus().len()
        };
        assert_eq!(count(&tree(cpus("cpus@0", 2), None)), 0);
        assert_eq!(count(&tree(cpus("cpus@0", 2), Some(cpus("cpus", 3)))), 3);
        assert_eq!(count(&tree(cpus("cpus", 1), Some(cpus("cpus", 3)))), 1);
    }
}
