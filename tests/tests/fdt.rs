//! `numaframe::fdt` on device trees that QEMU itself generates (`-M virt,dumpdtb=FILE`) for
//! NUMA layouts given as `-numa` options, and on mutations of them:
//! - nodes, distances, node states, memory ranges and the CPU → node list are the layout's;
//! - a machine without `-numa` is one node;
//! - no mutation of a real tree makes `parse` panic, every error displays and every error
//!   offset lies inside the tree.
//!
//! Needs `qemu-system-aarch64` on `PATH` (see `qemu.rs`).

mod qemu_support;

use numaframe::fdt::{
    FdtError, FdtTopology, Malformed, for_each_reservation, parse, string_property,
};
use numaframe::{MemoryRange, NodeId, NodeInfo, PhysRange, Topology};
use numaframe_testkit::TempDir;
use proptest::prelude::*;
use qemu_support::{Layout, NodeDesc, run_qemu};
use std::sync::OnceLock;
use std::time::Duration;

const MIB: u64 = 1 << 20;
const RAM_BASE: u64 = 0x4000_0000;

/// The tree QEMU builds for `layout` (plus `-append bootargs`).
fn dump(layout: Option<&Layout>, bootargs: &str, name: &str) -> Vec<u8> {
    let dir = TempDir::new(name);
    let dtb = dir.path().join("virt.dtb");
    let kernel = dir.path().join("empty");
    std::fs::write(&kernel, [0u8; 16]).expect("write a dummy kernel");
    let mut args = match layout {
        Some(l) => l.qemu_args(),
        None => [
            "-M",
            "virt",
            "-cpu",
            "cortex-a57",
            "-smp",
            "2",
            "-m",
            "256M",
        ]
        .map(String::from)
        .to_vec(),
    };
    let machine = args
        .iter()
        .position(|a| a == "virt")
        .expect("-M virt is there");
    args[machine] = format!("virt,dumpdtb={}", dtb.display());
    args.extend(
        [
            "-kernel",
            kernel.to_str().expect("UTF-8 path"),
            "-append",
            bootargs,
            "-display",
            "none",
        ]
        .map(String::from),
    );
    let run = run_qemu(&args, Duration::from_secs(30));
    assert!(run.status.success(), "qemu dumpdtb failed: {}", run.stderr);
    std::fs::read(&dtb).expect("QEMU wrote the tree")
}

struct Out {
    dist: Vec<u8>,
    infos: Vec<NodeInfo>,
    ranges: Vec<MemoryRange>,
    cpus: Vec<NodeId>,
}

impl Out {
    fn new() -> Out {
        Out {
            dist: vec![0; 64 * 64],
            infos: vec![NodeInfo::default(); 64],
            ranges: vec![
                MemoryRange {
                    node: NodeId::new(0),
                    range: PhysRange::default()
                };
                64
            ],
            cpus: vec![NodeId::new(0); 64],
        }
    }
    fn topo(&mut self) -> FdtTopology<'_> {
        FdtTopology::new(
            &mut self.dist,
            &mut self.infos,
            &mut self.ranges,
            &mut self.cpus,
        )
    }
}

/// Checks that `parse` reads `layout` back from QEMU's tree.
fn check(layout: &Layout, name: &str) {
    let dtb = dump(
        Some(layout),
        "hugepagesz=2M hugepages=2 numaframe.linux_boot_order",
        name,
    );
    let mut o = Out::new();
    let mut t = o.topo();
    let info = parse(&dtb, &mut t).unwrap_or_else(|e| panic!("{name}: {e}"));
    let n = layout.nodes.len();
    assert!(info.numa);
    assert_eq!(info.total_size, dtb.len());
    assert_eq!(
        info.bootargs,
        Some("hugepagesz=2M hugepages=2 numaframe.linux_boot_order")
    );
    assert_eq!(t.nodes(), n, "{name}");
    let flat: Vec<u8> = layout.distances.iter().flatten().copied().collect();
    assert_eq!(t.distances(), &flat[..], "{name}");
    for (i, (info, want)) in t.infos().iter().zip(&layout.nodes).enumerate() {
        assert_eq!(
            info.has_cpus,
            !want.cpus.is_empty(),
            "{name}: node {i} CPUs"
        );
        assert_eq!(info.has_memory, want.mem_mib > 0, "{name}: node {i} memory");
    }
    // QEMU lays the nodes' memory out in node order from the base of RAM.
    let mut base = RAM_BASE;
    let mut want_ranges = Vec::new();
    for (i, NodeDesc { mem_mib, .. }) in layout.nodes.iter().enumerate() {
        if *mem_mib > 0 {
            let r = PhysRange::from_bytes(numaframe::PhysAddr::new(base), mem_mib * MIB).unwrap();
            want_ranges.push(MemoryRange {
                node: NodeId::new(i),
                range: r,
            });
            base += mem_mib * MIB;
        }
    }
    let mut got = t.ranges().to_vec();
    got.sort_by_key(|r| r.range.start());
    assert_eq!(got, want_ranges, "{name}");
    let mut cpu_nodes = vec![NodeId::new(0); layout.cpus()];
    for (i, node) in layout.nodes.iter().enumerate() {
        for &c in &node.cpus {
            cpu_nodes[c as usize] = NodeId::new(i);
        }
    }
    assert_eq!(t.cpus(), &cpu_nodes[..], "{name}");
    let topo: Topology<'_> = t.topology().unwrap();
    assert_eq!(topo.len(), n);
    assert_eq!(
        string_property(&dtb, "/psci", "method").unwrap(),
        Some("hvc"),
        "QEMU at EL1 answers PSCI through hvc"
    );
    let mut reserved = 0;
    for_each_reservation(&dtb, |_, _| reserved += 1).unwrap();
    assert_eq!(reserved, 0, "QEMU virt reserves nothing");
}

#[test]
fn qemu_trees_for_the_test_layouts() {
    check(&Layout::amd_4node(), "fdt-amd");
    check(&Layout::cpuless_memoryless(), "fdt-mixed");
}

#[test]
fn qemu_tree_for_eight_nodes_over_two_sockets() {
    let d = |a: usize, b: usize| -> u8 {
        if a == b {
            10
        } else if a / 4 == b / 4 {
            12
        } else {
            32
        }
    };
    let layout = Layout {
        nodes: (0..8)
            .map(|i| NodeDesc {
                mem_mib: 128,
                cpus: vec![i],
            })
            .collect(),
        distances: (0..8).map(|a| (0..8).map(|b| d(a, b)).collect()).collect(),
    };
    check(&layout, "fdt-8");
}

#[test]
fn qemu_tree_without_numa_is_one_node() {
    let dtb = dump(None, "", "fdt-flat");
    let mut o = Out::new();
    let mut t = o.topo();
    let info = parse(&dtb, &mut t).unwrap();
    assert!(!info.numa);
    assert_eq!(t.nodes(), 1);
    assert_eq!(t.distances(), &[10]);
    assert_eq!(t.cpus(), &[NodeId::new(0), NodeId::new(0)]);
    assert_eq!(t.ranges().len(), 1);
    assert_eq!(t.ranges()[0].range.bytes(), 256 * MIB);
    assert_eq!(info.bootargs, None, "QEMU leaves out an empty -append");
}

fn real_tree() -> &'static [u8] {
    static TREE: OnceLock<Vec<u8>> = OnceLock::new();
    TREE.get_or_init(|| {
        let mut dtb = dump(
            Some(&Layout::cpuless_memoryless()),
            "hugepages=1",
            "fdt-fuzz",
        );
        // QEMU pads the tree to 1 MiB; mutate only the used part.
        let strings_end = u32::from_be_bytes(dtb[12..16].try_into().unwrap())
            + u32::from_be_bytes(dtb[32..36].try_into().unwrap());
        dtb.truncate(strings_end as usize);
        dtb[4..8].copy_from_slice(&strings_end.to_be_bytes());
        dtb
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    /// Whatever bytes change, `parse` returns (a result or a typed error) and never panics.
    #[test]
    fn mutated_qemu_trees_never_panic(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        word in proptest::option::of((any::<prop::sample::Index>(), prop_oneof![
            Just(1u32), Just(2), Just(3), Just(4), Just(9), Just(0), Just(u32::MAX), Just(0x7fff_ffff)
        ])),
        cut in proptest::option::of(any::<prop::sample::Index>()),
    ) {
        let mut dtb = real_tree().to_vec();
        for (at, byte) in edits {
            let i = at.index(dtb.len());
            dtb[i] = byte;
        }
        if let Some((at, w)) = word {
            let i = at.index(dtb.len() / 4) * 4;
            dtb[i..i + 4].copy_from_slice(&w.to_be_bytes());
        }
        if let Some(at) = cut {
            let len = at.index(dtb.len());
            dtb.truncate(len);
        }
        let mut o = Out::new();
        match parse(&dtb, &mut o.topo()) {
            Ok(_) => {}
            Err(e) => {
                prop_assert!(!e.to_string().is_empty());
                prop_assert!(e.offset().is_none_or(|at| at < dtb.len()), "{e:?}");
            }
        }
        if let Err(e) = string_property(&dtb, "/chosen", "bootargs") {
            prop_assert!(e.offset().is_none_or(|at| at < dtb.len()), "{e:?}");
        }
        if let Err(e) = for_each_reservation(&dtb, |_, _| {}) {
            prop_assert!(e.offset().is_none_or(|at| at < dtb.len()), "{e:?}");
        }
    }
}

fn word(dtb: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(dtb[at..at + 4].try_into().unwrap())
}

/// `dtb` with the name of its first node called `name` emptied, the structure block shrunk to
/// match and the blocks after it moved down (as `dtc` would lay out the renamed tree).
fn with_name_emptied(dtb: &[u8], name: &str) -> Vec<u8> {
    let (off_struct, size_struct) = (word(dtb, 8) as usize, word(dtb, 36) as usize);
    let mut entry = 1u32.to_be_bytes().to_vec();
    entry.extend(name.as_bytes());
    entry.push(0);
    let at = (off_struct..off_struct + size_struct)
        .step_by(4)
        .find(|&i| dtb[i..].starts_with(&entry))
        .expect("the tree has a node of that name")
        + 4;
    let padded = (name.len() + 1).next_multiple_of(4);
    let shrink = (padded - 4) as u32;
    let mut out = dtb[..at].to_vec();
    out.extend([0; 4]);
    out.extend(&dtb[at + padded..]);
    let after = |field| word(dtb, field) as usize > at;
    for (field, moves) in [(4, true), (12, after(12)), (16, after(16)), (36, true)] {
        if moves {
            let w = word(&out, field) - shrink;
            out[field..field + 4].copy_from_slice(&w.to_be_bytes());
        }
    }
    out
}

#[test]
fn a_nameless_memory_node_is_malformed_at_the_root() {
    // The `fdt` crate reports an empty node name as "/", a string outside the tree: the error
    // must still name a byte of the tree, the root's (where the structure block starts).
    let tree = real_tree();
    let mut o = Out::new();
    parse(tree, &mut o.topo()).expect("the real tree parses");
    let dtb = with_name_emptied(tree, "memory@40000000");
    let want = Err(FdtError::Malformed {
        at: word(&dtb, 8) as usize,
        kind: Malformed::UnnamedNode,
    });
    assert_eq!(parse(&dtb, &mut o.topo()).map(|_| ()), want);
    assert_eq!(
        string_property(&dtb, "/chosen", "bootargs").map(|_| ()),
        want
    );
    assert_eq!(for_each_reservation(&dtb, |_, _| {}), want);
}

#[test]
fn errors_are_typed() {
    let mut o = Out::new();
    assert!(matches!(
        parse(&[0; 8], &mut o.topo()),
        Err(FdtError::BadMagic { magic: 0 })
    ));
    let tree = real_tree();
    assert!(matches!(
        parse(&tree[..100], &mut o.topo()),
        Err(FdtError::Truncated { .. })
    ));
}
