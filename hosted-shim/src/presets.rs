//! The built-in machines of the preset table in docs/ ("Hosted CLI contract").
//!
//! CPUs are numbered consecutively across nodes (node 0 has CPUs `0..k`, node 1 the next `k`,
//! and so on), and every node has an explicit socket id.
#![deny(unsafe_code)]

use numaframe::NodeId;

use crate::spec::{MachineSpec, NodeSpec};

/// The names [`preset`] knows, in the order docs/ lists them.
pub const PRESETS: &[&str] = &[
    "amd-4node",
    "dual-socket-8node",
    "cxl-2socket",
    "fake-64",
    "1tb-2node",
    "12tb-2node",
];

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const TIB: u64 = 1 << 40;

/// The preset machine `name`, or `None` if there is no such preset (see [`PRESETS`]).
pub fn preset(name: &str) -> Option<MachineSpec> {
    let (nodes, distances, link) = match name {
        "amd-4node" => (
            uniform(4, 8, 16 * GIB, |i| i / 2),
            from_rows(&[
                [10, 12, 32, 32],
                [12, 10, 32, 32],
                [32, 32, 10, 12],
                [32, 32, 12, 10],
            ]),
            None,
        ),
        "dual-socket-8node" => (
            uniform(8, 4, 16 * GIB, |i| i / 4),
            table(8, |a, b| if a / 4 == b / 4 { 12 } else { 32 }),
            None,
        ),
        "cxl-2socket" => (
            cxl_nodes(),
            from_rows(&[
                [10, 21, 14, 24],
                [21, 10, 24, 14],
                [14, 24, 10, 34],
                [24, 14, 34, 10],
            ]),
            Some(150),
        ),
        "fake-64" => (uniform(64, 1, 48 * MIB, |_| 0), table(64, |_, _| 10), None),
        "1tb-2node" => (uniform(2, 2, 512 * GIB, |i| i), table(2, |_, _| 21), None),
        "12tb-2node" => (uniform(2, 2, 6 * TIB, |i| i), table(2, |_, _| 21), None),
        _ => return None,
    };
    // The tables above are constants checked by the tests, so this only fails on a typo there.
    MachineSpec::new(name, nodes, distances, link).ok()
}

/// `n` nodes with `cpus` consecutive CPUs and `memory` bytes each, node `i` in socket `socket(i)`.
fn uniform(n: u32, cpus: u32, memory: u64, socket: fn(u32) -> u32) -> Vec<NodeSpec> {
    (0..n)
        .map(|i| NodeSpec {
            cpus: (i * cpus..(i + 1) * cpus).collect(),
            memory_bytes: memory,
            socket: Some(socket(i) as u16),
            ..NodeSpec::default()
        })
        .collect()
}

/// Two DRAM nodes with 16 CPUs each and two CPU-less CXL nodes, one per socket.
fn cxl_nodes() -> Vec<NodeSpec> {
    let dram = |i: u32| NodeSpec {
        cpus: (i * 16..(i + 1) * 16).collect(),
        memory_bytes: 64 * GIB,
        socket: Some(i as u16),
        initiator: None,
        bandwidth_gbps: Some(300),
    };
    let cxl = |i: u32| NodeSpec {
        cpus: Vec::new(),
        memory_bytes: 32 * GIB,
        socket: Some(i as u16),
        initiator: Some(NodeId::new(i as usize)),
        bandwidth_gbps: Some(100),
    };
    vec![dram(0), dram(1), cxl(0), cxl(1)]
}

fn from_rows<const N: usize>(rows: &[[u8; N]; N]) -> Vec<u8> {
    rows.iter().flatten().copied().collect()
}

/// An `n × n` table: 10 on the diagonal, `remote(a, b)` elsewhere.
fn table(n: usize, remote: fn(usize, usize) -> u8) -> Vec<u8> {
    (0..n * n)
        .map(|k| {
            if k / n == k % n {
                10
            } else {
                remote(k / n, k % n)
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use numaframe::zonelist::FallbackOptions;

    use super::*;

    #[test]
    fn every_preset_builds() {
        for name in PRESETS {
            let s = preset(name).unwrap_or_else(|| panic!("{name} invalid"));
            assert_eq!(s.name(), *name);
            assert!(s.nodes().iter().all(|n| n.socket.is_some()), "{name}");
            let cpus: Vec<u32> = s
                .nodes()
                .iter()
                .flat_map(|n| n.cpus.iter().copied())
                .collect();
            assert_eq!(
                cpus,
                (0..cpus.len() as u32).collect::<Vec<_>>(),
                "{name}: CPUs consecutive"
            );
        }
        assert!(preset("nope").is_none());
    }

    #[test]
    fn shapes() {
        let s = |n| preset(n).unwrap();
        let amd = s("amd-4node");
        assert_eq!(
            amd.nodes().iter().map(|n| n.socket).collect::<Vec<_>>(),
            [Some(0), Some(0), Some(1), Some(1)]
        );
        assert!(
            amd.nodes()
                .iter()
                .all(|n| n.cpus.len() == 8 && n.memory_bytes == 16 * GIB)
        );
        let d8 = s("dual-socket-8node");
        assert_eq!(d8.distance(NodeId::new(1), NodeId::new(3)), Some(12));
        assert_eq!(d8.distance(NodeId::new(3), NodeId::new(4)), Some(32));
        assert_eq!(d8.nodes()[5].socket, Some(1));
        let cxl = s("cxl-2socket");
        assert_eq!(cxl.socket_link_gbps(), Some(150));
        assert_eq!(
            cxl.nodes()
                .iter()
                .map(|n| n.bandwidth_gbps.unwrap())
                .collect::<Vec<_>>(),
            [300, 300, 100, 100]
        );
        assert_eq!(
            cxl.nodes()
                .iter()
                .map(|n| n.memory_bytes / GIB)
                .collect::<Vec<_>>(),
            [64, 64, 32, 32]
        );
        assert_eq!(cxl.nodes()[3].initiator, Some(NodeId::new(1)));
        assert_eq!(cxl.nodes()[1].cpus, (16..32).collect::<Vec<_>>());
        let fake = s("fake-64");
        assert_eq!((fake.len(), fake.total_memory_bytes()), (64, 64 * 48 * MIB));
        assert!(fake.distances().iter().all(|&d| d == 10));
        assert_eq!(s("1tb-2node").total_memory_bytes(), TIB);
        assert_eq!(s("12tb-2node").total_memory_bytes(), 12 * TIB);
        assert_eq!(s("12tb-2node").distances(), [10, 21, 21, 10]);
        assert_eq!(s("12tb-2node").nodes()[1].socket, Some(1));
    }

    #[test]
    fn amd_fallback_is_the_seed_order() {
        let rows: Vec<Vec<usize>> = preset("amd-4node")
            .unwrap()
            .fallback_orders(FallbackOptions::default())
            .iter()
            .map(|r| r.iter().map(|n| n.index()).collect())
            .collect();
        assert_eq!(
            rows,
            [[0, 1, 2, 3], [1, 0, 3, 2], [2, 3, 0, 1], [3, 2, 1, 0]]
        );
    }
}
