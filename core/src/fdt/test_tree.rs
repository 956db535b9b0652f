//! Test fixtures: a small device-tree writer (`dtc` in a few lines), the storage a parse fills,
//! and a four-node tree.
extern crate std;

use std::vec;
use std::vec::Vec;

use super::{FdtError, FdtTopology, parse};
use crate::addr::PhysRange;
use crate::machine::MemoryRange;
pub(super) use crate::test_util::n;
use crate::topology::{NodeId, NodeInfo};

pub(super) const G: u64 = 1 << 30;

/// A node: name, properties (name, raw value), children.
#[derive(Clone, Debug, Default)]
pub(super) struct TestNode {
    pub(super) name: &'static str,
    pub(super) props: Vec<(&'static str, Vec<u8>)>,
    pub(super) children: Vec<TestNode>,
}

pub(super) fn cells(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|c| c.to_be_bytes()).collect()
}

pub(super) fn string(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

impl TestNode {
    pub(super) fn new(name: &'static str) -> Self {
        Self {
            name,
            ..Self::default()
        }
    }
    pub(super) fn prop(mut self, name: &'static str, value: Vec<u8>) -> Self {
        self.props.push((name, value));
        self
    }
    pub(super) fn child(mut self, c: TestNode) -> Self {
        self.children.push(c);
        self
    }
}

fn emit(n: &TestNode, s: &mut Vec<u8>, strings: &mut Vec<u8>) {
    s.extend(1u32.to_be_bytes());
    s.extend(n.name.as_bytes());
    s.push(0);
    while !s.len().is_multiple_of(4) {
        s.push(0);
    }
    for (name, value) in &n.props {
        let off = match strings
            .windows(name.len() + 1)
            .position(|w| &w[..name.len()] == name.as_bytes() && w[name.len()] == 0)
        {
            Some(o) => o,
            None => {
                let o = strings.len();
                strings.extend(name.as_bytes());
                strings.push(0);
                o
            }
        };
        s.extend(3u32.to_be_bytes());
        s.extend((value.len() as u32).to_be_bytes());
        s.extend((off as u32).to_be_bytes());
        s.extend(value);
        while !s.len().is_multiple_of(4) {
            s.push(0);
        }
    }
    for c in &n.children {
        emit(c, s, strings);
    }
    s.extend(2u32.to_be_bytes());
}

/// The blob of `root` with the given memory reservations.
pub(super) fn blob(root: &TestNode, reservations: &[(u64, u64)]) -> Vec<u8> {
    let (mut s, mut strings) = (Vec::new(), Vec::new());
    emit(root, &mut s, &mut strings);
    s.extend(9u32.to_be_bytes());
    let off_rsv = 40u32;
    let rsv_len = (reservations.len() as u32 + 1) * 16;
    let off_struct = off_rsv + rsv_len;
    let off_strings = off_struct + s.len() as u32;
    let total = off_strings + strings.len() as u32;
    let mut out = Vec::new();
    for w in [
        0xd00d_feed,
        total,
        off_struct,
        off_strings,
        off_rsv,
        17,
        16,
        0,
        strings.len() as u32,
        s.len() as u32,
    ] {
        out.extend(u32::to_be_bytes(w));
    }
    for &(b, l) in reservations.iter().chain(&[(0, 0)]) {
        out.extend(b.to_be_bytes());
        out.extend(l.to_be_bytes());
    }
    out.extend(s);
    out.extend(strings);
    out
}

/// A root node with two address and two size cells.
pub(super) fn root() -> TestNode {
    TestNode::new("")
        .prop("#address-cells", cells(&[2]))
        .prop("#size-cells", cells(&[2]))
}

/// A memory node (under [`root`]) of `size` bytes at `base`, on `node` if given.
pub(super) fn memory(base: u64, size: u64, node: Option<u32>) -> TestNode {
    let m = TestNode::new("memory@0")
        .prop("device_type", string("memory"))
        .prop(
            "reg",
            cells(&[
                (base >> 32) as u32,
                base as u32,
                (size >> 32) as u32,
                size as u32,
            ]),
        );
    match node {
        Some(id) => m.prop("numa-node-id", cells(&[id])),
        None => m,
    }
}

/// A QEMU-virt-like tree: `mem[i] = (node, base, size)`, `cpus[i] = node`,
/// `matrix` triples.
pub(super) fn machine(
    mem: &[(Option<u32>, u64, u64)],
    cpus: &[Option<u32>],
    matrix: Option<&[(u32, u32, u32)]>,
    bootargs: Option<&str>,
) -> Vec<u8> {
    let mut root = root().prop("compatible", string("linux,dummy-virt"));
    let mut chosen = TestNode::new("chosen");
    if let Some(b) = bootargs {
        chosen = chosen.prop("bootargs", string(b));
    }
    root = root.child(chosen);
    for &(node, base, size) in mem {
        root = root.child(memory(base, size, node));
    }
    let mut cpu_list = TestNode::new("cpus")
        .prop("#address-cells", cells(&[1]))
        .prop("#size-cells", cells(&[0]))
        .child(TestNode::new("cpu-map").child(TestNode::new("socket0")));
    for (i, &node) in cpus.iter().enumerate() {
        let mut c = TestNode::new("cpu@0")
            .prop("device_type", string("cpu"))
            .prop("reg", cells(&[i as u32]))
            .prop("compatible", string("arm,cortex-a57"));
        if let Some(id) = node {
            c = c.prop("numa-node-id", cells(&[id]));
        }
        cpu_list = cpu_list.child(c);
    }
    root = root.child(cpu_list);
    if let Some(m) = matrix {
        let flat: Vec<u32> = m.iter().flat_map(|&(a, b, d)| [a, b, d]).collect();
        root = root.child(
            TestNode::new("distance-map")
                .prop("compatible", string("numa-distance-map-v1"))
                .prop("distance-matrix", cells(&flat)),
        );
    }
    root = root.child(TestNode::new("psci").prop("method", string("hvc")));
    blob(&root, &[])
}

/// Storage for [`parse`] to fill.
pub(super) struct Out {
    dist: Vec<u8>,
    infos: Vec<NodeInfo>,
    ranges: Vec<MemoryRange>,
    cpus: Vec<NodeId>,
}

impl Out {
    pub(super) fn new(nodes: usize, ranges: usize, cpus: usize) -> Out {
        Out {
            dist: vec![0; nodes * nodes],
            infos: vec![NodeInfo::default(); nodes],
            ranges: vec![
                MemoryRange {
                    node: NodeId::new(0),
                    range: PhysRange::default()
                };
                ranges
            ],
            cpus: vec![NodeId::new(0); cpus],
        }
    }
    pub(super) fn topo(&mut self) -> FdtTopology<'_> {
        FdtTopology::new(
            &mut self.dist,
            &mut self.infos,
            &mut self.ranges,
            &mut self.cpus,
        )
    }
}

/// The error `parse` returns for `dtb` with room for 4 nodes, 8 ranges and 8 CPUs; it displays.
pub(super) fn error_of(dtb: &[u8]) -> FdtError {
    let e = parse(dtb, &mut Out::new(4, 8, 8).topo()).unwrap_err();
    assert!(!std::format!("{e}").is_empty());
    e
}

/// Four nodes in two pairs, as QEMU describes an AMD-like machine.
pub(super) fn amd() -> Vec<u8> {
    let d = [
        [10, 12, 32, 32],
        [12, 10, 32, 32],
        [32, 32, 10, 12],
        [32, 32, 12, 10],
    ];
    let m: Vec<_> = (0..4)
        .flat_map(|a| (0..4).map(move |b| (a as u32, b as u32, d[a][b])))
        .collect();
    let mem: Vec<_> = (0..4)
        .map(|i| (Some(i as u32), G + i as u64 * G, G))
        .collect();
    machine(
        &mem,
        &[Some(0), Some(1), Some(2), Some(3)],
        Some(&m),
        Some("hugepagesz=2M hugepages=4 numaframe.linux_boot_order"),
    )
}
