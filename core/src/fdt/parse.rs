//! [`parse`]: a look at `/chosen`, one walk over the root's children (memory nodes, `/cpus`), a
//! search of the tree for the distance map, then the tables sized from what it found and filled.
#![deny(unsafe_code)]

use super::error::{FdtError, Table};
use super::memory::UsableRange;
use super::output::{FdtInfo, FdtTopology};
use super::tree::{Props, Tree};
use super::value::{self, Cells};
use super::{cpus, distance, memory};
use crate::machine::MemoryRange;
use crate::topology::{NodeId, NodeInfo, NodeMask};

/// Reads the NUMA topology, memory and CPUs of `dtb` into `out`.
///
/// # Errors
/// An [`FdtError`] for a malformed tree, a NUMA description that breaks Linux's rules (see the
/// [module docs](super)), or tables in `out` too small for the tree (then
/// [`FdtError::NoRoom`] says how many entries it needs). `out` may be partly written on error.
pub fn parse<'d>(dtb: &'d [u8], out: &mut FdtTopology<'_>) -> Result<FdtInfo<'d>, FdtError> {
    out.nodes = 0;
    out.nranges = 0;
    out.ncpus = 0;
    let tree = Tree::open(dtb)?;
    let root = tree.root();
    let rp = tree.props(&root)?;
    let cells = Cells::read(dtb, rp.address_cells, rp.size_cells)?;

    let mut max_id = 0usize;
    let mut numa = false;
    let mut missing_id: Option<usize> = None;
    // Linux's lookup of `/cpus` by path takes the first match (`of_find_node_by_path`, the name
    // exactly).
    let mut cpus_seen = false;
    let mut memory_nodes = 0usize;
    let (mut nranges, mut ncpus) = (0usize, 0usize);
    // An error that matters only on a NUMA machine (a CPU's id, a disabled memory node's).
    let mut numa_error: Option<FdtError> = None;
    // The nodes Linux marks parsed (`numa_nodes_parsed`), which become the possible ones: those
    // of memory nodes, of CPUs' own ids and first in a distance triple.
    let mut parsed = NodeMask::EMPTY;
    // The node CPUs without an id of their own found up their parents, if any did.
    let mut inherited: Option<NodeId> = None;

    // `/chosen` as Linux's `early_init_dt_scan_chosen` finds it (`fdt_path_offset`: the first
    // child so named, with or without a unit address, whatever its status): its `bootargs`, and
    // its `linux,usable-memory-range`, which caps the memory of every memory node.
    let mut bootargs = None;
    let mut usable = UsableRange::default();
    if let Some(chosen) = tree.child(&root, "chosen")? {
        if let Some(v) = tree.property(&chosen, "bootargs")? {
            bootargs = value::bootargs(dtb, v)?;
        }
        let v = tree.property(&chosen, "linux,usable-memory-range")?;
        usable = UsableRange::read(dtb, v, cells)?;
    }

    tree.children(&root, |child| {
        let p = tree.props(&child)?;
        let available = value::available(p.status);
        // Linux finds `/cpus` (`of_get_next_cpu_node`) by path, which looks at no status.
        let is_cpus = !cpus_seen && child.name == "cpus" && tree.unit_address(&child)?.is_none();
        // Linux's `of_numa_parse_memory_nodes` finds memory nodes by type, whatever their status,
        // and marks the node of each with an id and a `reg` possible; only their ranges are not
        // memory. A bad id or `reg` there fails Linux's NUMA set-up, and is an error here as for
        // an enabled node; like a CPU's id, it matters only on a NUMA machine.
        if !available && value::is(p.device_type, "memory") {
            let id = memory::node_id(dtb, &p).and_then(|id| {
                if id.is_some() {
                    memory::for_each_range(dtb, &child, &p, cells, UsableRange::default(), |_| {})?;
                }
                Ok(id)
            });
            match id {
                Ok(Some(id)) => {
                    parsed.insert(id);
                }
                Ok(None) => {}
                Err(e) => {
                    numa_error.get_or_insert(e);
                }
            }
            return Ok(());
        }
        if !available && !is_cpus {
            return Ok(());
        }
        if available && value::is(p.device_type, "memory") {
            memory_nodes += 1;
            let id = memory::node_id(dtb, &p)?;
            if let Some(id) = id {
                numa = true;
                parsed.insert(id);
            } else {
                missing_id.get_or_insert(child.at);
            }
            let node = id.unwrap_or(NodeId::new(0));
            max_id = max_id.max(node.index());
            // Linux's `early_init_dt_scan_memory` gives memblock the ranges of
            // `linux,usable-memory` if the node has one, and of `reg` only otherwise.
            let mem = Props {
                reg: p.usable_memory.or(p.reg),
                ..p
            };
            memory::for_each_range(dtb, &child, &mem, cells, usable, |range| {
                if let Some(slot) = out.ranges.get_mut(nranges) {
                    *slot = MemoryRange { node, range };
                }
                nranges += 1;
            })?;
        } else if is_cpus {
            cpus_seen = true;
            let up = cpus::parent_node(dtb, &p, &rp);
            cpus::for_each_cpu(&tree, &child, |own| {
                let node = match (own, up) {
                    (Some(own), _) => own.inspect(|&id| {
                        parsed.insert(id);
                    }),
                    (None, Some(up)) => up.inspect(|&id| inherited = Some(id)),
                    (None, None) => Ok(NodeId::new(0)),
                };
                // A CPU's id matters only on a NUMA machine: its error waits for `numa`.
                let node = node.unwrap_or_else(|e| {
                    numa_error.get_or_insert(e);
                    NodeId::new(0)
                });
                if let Some(slot) = out.cpus.get_mut(ncpus) {
                    *slot = node;
                }
                ncpus += 1;
            })?;
        }
        Ok(())
    })?;

    if memory_nodes == 0 || nranges == 0 {
        return Err(FdtError::NoMemory);
    }
    if numa && let Some(at) = missing_id {
        return Err(FdtError::MissingNodeId { at });
    }
    if numa && let Some(e) = numa_error {
        return Err(e);
    }
    if nranges > out.ranges.len() {
        return Err(FdtError::NoRoom {
            table: Table::Ranges,
            needed: nranges,
            capacity: out.ranges.len(),
        });
    }
    if ncpus > out.cpus.len() {
        return Err(FdtError::NoRoom {
            table: Table::Cpus,
            needed: ncpus,
            capacity: out.cpus.len(),
        });
    }

    // A tree whose memory nodes carry no `numa-node-id` describes a machine without NUMA: one
    // node with everything, whatever CPUs and distance map say (Linux's `dummy_numa_init`).
    // Like a CPU's id, the distance map matters only on a NUMA machine.
    let matrix = if numa {
        distance::find(&tree, &root, 0)?.transpose()?
    } else {
        None
    };
    if numa {
        if let Some(m) = matrix {
            max_id = max_id.max(distance::max_node(dtb, m)?);
            parsed = parsed.or(&distance::sources(dtb, m)?);
        }
        // Linux's `of_node_to_nid` gives NUMA_NO_NODE, and `early_map_cpu_to_node` node 0, for
        // a node found up the parents that is not possible. A CPU whose own id named it would
        // have made it possible, so every CPU on it found it up the parents.
        if let Some(up) = inherited
            && !parsed.contains(up)
        {
            for c in out.cpus[..ncpus].iter_mut().filter(|c| **c == up) {
                *c = NodeId::new(0);
            }
        }
        max_id = out.cpus[..ncpus]
            .iter()
            .copied()
            .chain(&parsed)
            .map(|n| n.index())
            .fold(max_id, usize::max);
    } else {
        out.cpus[..ncpus].fill(NodeId::new(0));
    }
    let n = max_id + 1;
    if n > out.infos.len() {
        return Err(FdtError::NoRoom {
            table: Table::Nodes,
            needed: n,
            capacity: out.infos.len(),
        });
    }
    if n * n > out.distances.len() {
        return Err(FdtError::NoRoom {
            table: Table::Distances,
            needed: n * n,
            capacity: out.distances.len(),
        });
    }
    distance::fill(dtb, matrix, &mut out.distances[..n * n], n)?;
    let infos = &mut out.infos[..n];
    infos.fill(NodeInfo::default());
    for r in &out.ranges[..nranges] {
        infos[r.node.index()].has_memory = true;
    }
    for c in &out.cpus[..ncpus] {
        infos[c.index()].has_cpus = true;
    }
    out.nodes = n;
    out.nranges = nranges;
    out.ncpus = ncpus;
    Ok(FdtInfo {
        total_size: tree.header.total_size,
        boot_cpuid: tree.header.boot_cpuid,
        bootargs,
        numa,
    })
}

#[cfg(test)]
mod tests {
    use super::super::test_tree::{G, Out, amd, error_of, machine, n};
    use super::*;
    use crate::addr::{PAGE_SIZE, Pfn};

    #[test]
    fn four_nodes_like_qemu() {
        let dtb = amd();
        let mut o = Out::new(8, 8, 8);
        let mut t = o.topo();
        let info = parse(&dtb, &mut t).unwrap();
        assert_eq!(t.nodes(), 4);
        assert_eq!(
            t.distances(),
            &[
                10, 12, 32, 32, 12, 10, 32, 32, 32, 32, 10, 12, 32, 32, 12, 10
            ]
        );
        assert_eq!(t.cpus(), &[n(0), n(1), n(2), n(3)]);
        assert_eq!(t.ranges().len(), 4);
        assert_eq!(t.ranges()[2].node, n(2));
        assert_eq!(t.ranges()[2].range.start(), Pfn::new(3 * G / PAGE_SIZE));
        assert!(t.infos().iter().all(|i| i.has_cpus && i.has_memory));
        assert_eq!(
            info.bootargs,
            Some("hugepagesz=2M hugepages=4 numaframe.linux_boot_order")
        );
        assert!(info.numa);
        assert_eq!(info.total_size, dtb.len());
        t.topology().unwrap();
    }

    #[test]
    fn bootargs_are_read_from_the_first_chosen_node_as_linux_copies_them() {
        // Linux's `early_init_dt_scan_chosen` (drivers/of/fdt.c) takes `fdt_path_offset(fdt,
        // "/chosen")`: the first child of the root named `chosen`, with or without a unit
        // address (libfdt's `fdt_nodename_eq_`), whatever its status. It ignores an empty
        // `bootargs` and copies a value of length `l` with `strscpy(cmdline, p, l)`: the bytes
        // before the first NUL, at most `l - 1` of them.
        use super::super::test_tree::{TestNode, blob, memory, root, string};
        fn chosen(name: &'static str, status: Option<&str>, args: &[u8]) -> TestNode {
            let c = TestNode::new(name).prop("bootargs", args.into());
            match status {
                Some(s) => c.prop("status", string(s)),
                None => c,
            }
        }
        // `Err` holds the length of the value a `BadProperty` names.
        fn read(nodes: impl IntoIterator<Item = TestNode>, want: Result<Option<&str>, usize>) {
            let root = nodes.into_iter().fold(
                root().child(memory(1 << 30, 1 << 30, None)),
                TestNode::child,
            );
            let dtb = blob(&root, &[]);
            let mut o = Out::new(1, 1, 1);
            let mut t = o.topo();
            let got = match parse(&dtb, &mut t) {
                Ok(info) => Ok(info.bootargs),
                Err(FdtError::BadProperty { len, .. }) => Err(len),
                Err(e) => panic!("{e:?}"),
            };
            assert_eq!(got, want);
        }
        read(
            [chosen("chosen", Some("disabled"), b"a=1\0")],
            Ok(Some("a=1")),
        );
        read([chosen("chosen@0", None, b"a=1\0")], Ok(Some("a=1")));
        read(
            [
                chosen("chosen@0", None, b"first\0"),
                chosen("chosen", None, b"second\0"),
            ],
            Ok(Some("first")),
        );
        read([chosen("chosen", None, b"")], Ok(None));
        read([chosen("chosen", None, b"a=1\0b=2\0")], Ok(Some("a=1")));
        read([chosen("chosen", None, b"a=12")], Ok(Some("a=1")));
        read([chosen("chosen", None, b"\0")], Ok(Some("")));
        read([chosen("chosen", None, b"a=\xff\0")], Err(4));
    }

    #[test]
    fn defaults_cpuless_and_memoryless_nodes() {
        // Node 1 has memory but no CPU; node 2 a CPU but no memory; no distance map; the
        // last CPU has no id and goes to node 0.
        let dtb = machine(
            &[(Some(0), G, G), (Some(1), 2 * G, G)],
            &[Some(0), Some(2), None],
            None,
            None,
        );
        let mut o = Out::new(4, 4, 4);
        let mut t = o.topo();
        let info = parse(&dtb, &mut t).unwrap();
        assert_eq!(info.bootargs, None);
        assert_eq!(t.nodes(), 3);
        assert_eq!(t.distances(), &[10, 20, 20, 20, 10, 20, 20, 20, 10]);
        let i = t.infos();
        assert!(i[0].has_cpus && i[0].has_memory);
        assert!(!i[1].has_cpus && i[1].has_memory);
        assert!(i[2].has_cpus && !i[2].has_memory);
        assert_eq!(t.cpus(), &[n(0), n(2), n(0)]);
    }

    #[test]
    fn without_numa_ids_the_machine_is_one_node() {
        let dtb = machine(
            &[(None, G, G), (None, 3 * G, G)],
            &[Some(1), None],
            Some(&[(0, 1, 15)]),
            None,
        );
        let mut o = Out::new(1, 2, 2);
        let mut t = o.topo();
        let info = parse(&dtb, &mut t).unwrap();
        assert!(!info.numa);
        assert_eq!(t.nodes(), 1);
        assert_eq!(t.cpus(), &[n(0), n(0)]);
        assert_eq!(t.ranges().len(), 2);
        assert_eq!(t.distances(), &[10]);
    }

    #[test]
    fn without_numa_ids_cpu_node_ids_are_ignored_whatever_they_say() {
        // No memory node carries `numa-node-id`: the module docs promise one node 0 with all
        // memory and CPUs "whatever CPUs and distance map say" (Linux's `dummy_numa_init`;
        // `early_map_cpu_to_node` also puts a CPU with an out-of-range id on node 0).
        let dtb = machine(&[(None, G, G)], &[Some(0), Some(5000)], None, None);
        let mut o = Out::new(1, 1, 2);
        let mut t = o.topo();
        let r = parse(&dtb, &mut t);
        assert!(r.is_ok(), "{r:?}");
        assert_eq!(t.nodes(), 1);
        assert_eq!(t.cpus(), &[n(0), n(0)]);
    }

    #[test]
    fn without_numa_ids_a_distance_map_without_a_matrix_is_ignored() {
        // "whatever CPUs and distance map say": a map node without `distance-matrix` too.
        use super::super::test_tree::{TestNode, blob, cells, root, string};
        let root = root()
            .child(
                TestNode::new("memory@40000000")
                    .prop("device_type", string("memory"))
                    .prop("reg", cells(&[0, 0x4000_0000, 0, 0x4000_0000])),
            )
            .child(
                TestNode::new("distance-map").prop("compatible", string("numa-distance-map-v1")),
            );
        let dtb = blob(&root, &[]);
        let mut o = Out::new(1, 1, 0);
        let mut t = o.topo();
        let r = parse(&dtb, &mut t);
        assert!(r.is_ok(), "{r:?}");
        assert_eq!(t.nodes(), 1);
    }

    #[test]
    fn no_room_says_how_much() {
        let dtb = amd();
        let mut o = Out::new(4, 2, 8);
        assert_eq!(
            parse(&dtb, &mut o.topo()),
            Err(FdtError::NoRoom {
                table: Table::Ranges,
                needed: 4,
                capacity: 2
            })
        );
        let mut o = Out::new(4, 4, 1);
        assert_eq!(
            parse(&dtb, &mut o.topo()),
            Err(FdtError::NoRoom {
                table: Table::Cpus,
                needed: 4,
                capacity: 1
            })
        );
        assert!(matches!(
            error_of(&machine(&[(Some(7), G, G)], &[], None, None)),
            FdtError::NoRoom {
                table: Table::Nodes,
                needed: 8,
                ..
            }
        ));
    }
}
