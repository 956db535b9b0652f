//! Topology readers and presets through the public API of `numaframe-hosted`: every preset is
//! valid, every preset survives a round trip through each text format and a fake sysfs tree,
//! malformed inputs give one-line errors, and no mutated input makes a reader panic.

use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use numaframe::NodeId;
use numaframe::zonelist::FallbackOptions;
use numaframe_hosted::presets::{PRESETS, preset};
use numaframe_hosted::readers::{
    DEFAULT_SYSFS_DIR, parse_numactl, parse_toml, read_numactl_file, read_sysfs, read_toml_file,
};
use numaframe_hosted::spec::{MachineSpec, SpecErrorKind, parse_cpulist, parse_size};
use numaframe_testkit::{Rng, TempDir};

fn presets() -> Vec<MachineSpec> {
    PRESETS
        .iter()
        .map(|name| preset(name).unwrap_or_else(|| panic!("preset {name} is invalid")))
        .collect()
}

/// `0-3,8` from ascending CPU numbers.
fn cpulist(cpus: &[u32]) -> String {
    let mut out = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            cpus[i].to_string()
        } else {
            format!("{}-{}", cpus[i], cpus[j])
        });
        i = j + 1;
    }
    out.join(",")
}

/// A spec as the TOML schema, nodes written in reverse id order.
fn to_toml(s: &MachineSpec) -> String {
    let n = s.len();
    let rows: Vec<String> = s.distances().chunks(n).map(|r| format!("{r:?}")).collect();
    let mut t = format!("distances = [{}]\n", rows.join(", "));
    if let Some(link) = s.socket_link_gbps() {
        writeln!(t, "socket_link_gbps = {link}").unwrap();
    }
    for (id, node) in s.nodes().iter().enumerate().rev() {
        writeln!(
            t,
            "\n[[node]]\nid = {id}\ncpus = \"{}\"\nmemory = \"{}K\"",
            cpulist(&node.cpus),
            node.memory_bytes >> 10
        )
        .unwrap();
        if let Some(v) = node.socket {
            writeln!(t, "socket = {v}").unwrap();
        }
        if let Some(v) = node.initiator {
            writeln!(t, "initiator = {v}").unwrap();
        }
        if let Some(v) = node.bandwidth_gbps {
            writeln!(t, "bandwidth_gbps = {v}").unwrap();
        }
    }
    t
}

/// A spec as `numactl --hardware` prints it.
fn to_numactl(s: &MachineSpec) -> String {
    let n = s.len();
    let mut t = format!("available: {n} nodes (0-{})\n", n - 1);
    for (id, node) in s.nodes().iter().enumerate() {
        let cpus: Vec<String> = node.cpus.iter().map(u32::to_string).collect();
        writeln!(t, "node {id} cpus: {}", cpus.join(" ")).unwrap();
        writeln!(t, "node {id} size: {} MB", node.memory_bytes >> 20).unwrap();
        writeln!(t, "node {id} free: {} MB", node.memory_bytes >> 21).unwrap();
    }
    t.push_str("node distances:\nnode ");
    for id in 0..n {
        write!(t, "{id:>4}").unwrap();
    }
    t.push('\n');
    for (id, row) in s.distances().chunks(n).enumerate() {
        write!(t, "{id:>3}:").unwrap();
        for d in row {
            write!(t, "{d:>4}").unwrap();
        }
        t.push('\n');
    }
    t
}

/// A spec as a Linux node directory (with `has_cpu`, `has_memory` and CPU package ids).
fn to_sysfs(s: &MachineSpec, dir: &TempDir) {
    let n = s.len();
    let with = |f: fn(&numaframe_hosted::spec::NodeSpec) -> bool| {
        let ids: Vec<u32> = s
            .nodes()
            .iter()
            .enumerate()
            .filter(|(_, node)| f(node))
            .map(|(i, _)| i as u32)
            .collect();
        cpulist(&ids) + "\n"
    };
    dir.put("has_cpu", &with(|node| !node.cpus.is_empty()));
    dir.put("has_memory", &with(|node| node.memory_bytes > 0));
    dir.put("possible", &format!("0-{}\n", n - 1));
    for (id, (node, row)) in s.nodes().iter().zip(s.distances().chunks(n)).enumerate() {
        let row: Vec<String> = row.iter().map(u8::to_string).collect();
        dir.put(&format!("node{id}/distance"), &(row.join(" ") + "\n"));
        dir.put(&format!("node{id}/cpulist"), &(cpulist(&node.cpus) + "\n"));
        let meminfo = format!(
            "Node {id} MemTotal:       {} kB\nNode {id} MemFree:        {} kB\n",
            node.memory_bytes >> 10,
            node.memory_bytes >> 11
        );
        dir.put(&format!("node{id}/meminfo"), &meminfo);
        if let (Some(cpu), Some(socket)) = (node.cpus.first(), node.socket) {
            dir.put(
                &format!("node{id}/cpu{cpu}/topology/physical_package_id"),
                &format!("{socket}\n"),
            );
        }
    }
}

/// The parts of a spec every format carries: CPUs, memory and distances.
fn shape(s: &MachineSpec) -> (Vec<Vec<u32>>, Vec<u64>, Vec<u8>) {
    (
        s.nodes().iter().map(|n| n.cpus.clone()).collect(),
        s.nodes().iter().map(|n| n.memory_bytes).collect(),
        s.distances().to_vec(),
    )
}

#[test]
fn every_preset_is_valid() {
    assert_eq!(
        PRESETS,
        [
            "amd-4node",
            "dual-socket-8node",
            "cxl-2socket",
            "fake-64",
            "1tb-2node",
            "12tb-2node"
        ]
    );
    for s in presets() {
        let topo = s.topology();
        assert_eq!(topo.len(), s.len());
        assert_eq!(topo.infos(), s.node_infos().as_slice());
        assert_eq!(
            s.fallback_orders(FallbackOptions::default()).len(),
            s.len(),
            "{}",
            s.name()
        );
        assert!(
            s.nodes().iter().all(|n| n.socket.is_some()),
            "{}: explicit sockets",
            s.name()
        );
    }
    assert!(preset("AMD-4NODE").is_none());
    assert!(preset("").is_none());
}

#[test]
fn preset_tables_match_the_design() {
    const GIB: u64 = 1 << 30;
    let cxl = preset("cxl-2socket").unwrap();
    assert_eq!(
        cxl.distances(),
        [
            10, 21, 14, 24, 21, 10, 24, 14, 14, 24, 10, 34, 24, 14, 34, 10
        ]
    );
    assert_eq!(
        cxl.nodes()
            .iter()
            .map(|n| (
                n.cpus.len(),
                n.memory_bytes / GIB,
                n.bandwidth_gbps,
                n.socket
            ))
            .collect::<Vec<_>>(),
        [
            (16, 64, Some(300), Some(0)),
            (16, 64, Some(300), Some(1)),
            (0, 32, Some(100), Some(0)),
            (0, 32, Some(100), Some(1))
        ]
    );
    assert_eq!(cxl.nodes()[2].initiator, Some(NodeId::new(0)));
    assert_eq!(cxl.socket_link_gbps(), Some(150));
    let d8 = preset("dual-socket-8node").unwrap();
    for a in 0..8 {
        for b in 0..8 {
            let want = if a == b {
                10
            } else if a / 4 == b / 4 {
                12
            } else {
                32
            };
            assert_eq!(d8.distance(NodeId::new(a), NodeId::new(b)), Some(want));
        }
    }
    assert_eq!(preset("12tb-2node").unwrap().total_memory_bytes(), 12 << 40);
}

#[test]
fn toml_round_trip() {
    for s in presets() {
        let text = to_toml(&s);
        let back = parse_toml(&text).unwrap_or_else(|e| panic!("{}: {e}\n{text}", s.name()));
        let want = {
            let mut w = s.clone();
            w.set_name("toml");
            w
        };
        assert_eq!(back, want, "{}", s.name());
    }
}

#[test]
fn numactl_round_trip() {
    for s in presets() {
        let text = to_numactl(&s);
        let back = parse_numactl(&text).unwrap_or_else(|e| panic!("{}: {e}\n{text}", s.name()));
        assert_eq!(shape(&back), shape(&s), "{}", s.name());
        assert!(
            back.nodes()
                .iter()
                .all(|n| n.socket.is_none() && n.initiator.is_none() && n.bandwidth_gbps.is_none())
        );
    }
}

#[test]
fn numactl_sparse_ids_are_rejected() {
    let text = "available: 2 nodes (0,2)\nnode 0 cpus: 0\nnode 0 size: 100 MB\nnode 0 free: 1 MB\nnode 2 cpus: 1\nnode 2 size: 100 MB\nnode 2 free: 1 MB\nnode distances:\nnode   0   2\n  0:  10  20\n  2:  20  10\n";
    let e = parse_numactl(text).unwrap_err();
    assert_eq!(e.line(), Some(1));
    assert!(e.to_string().contains("consecutive node ids"), "{e}");
}

#[test]
fn files_round_trip_and_errors_name_the_file() {
    let dir = TempDir::new("files");
    let s = preset("amd-4node").unwrap();
    let toml = dir.put("amd.toml", &to_toml(&s));
    let back = read_toml_file(&toml).unwrap();
    assert_eq!(back.name(), "amd");
    assert_eq!(shape(&back), shape(&s));
    let numactl = dir.put("amd.txt", &to_numactl(&s));
    assert_eq!(shape(&read_numactl_file(&numactl).unwrap()), shape(&s));

    let bad = dir.put(
        "bad.toml",
        &to_toml(&s).replace("memory = \"16777216K\"", "memory = \"lots\""),
    );
    let e = read_toml_file(&bad).unwrap_err();
    assert_eq!(e.file(), Some(bad.display().to_string().as_str()));
    assert!(e.line().is_some());
    assert!(matches!(e.kind(), SpecErrorKind::Size { .. }), "{e}");
    assert!(
        e.to_string().starts_with(&format!("{}:", bad.display())),
        "{e}"
    );

    let bad = dir.put(
        "bad.txt",
        &to_numactl(&s).replace("node 2 size: 16384 MB", "node 2 size: 16384 KB"),
    );
    let e = read_numactl_file(&bad).unwrap_err();
    assert!(
        e.to_string().starts_with(&format!(
            "{}:9: node 2 size: expected `N MB`",
            bad.display()
        )),
        "{e}"
    );

    let missing = dir.path().join("missing.toml");
    assert!(matches!(
        read_toml_file(&missing).unwrap_err().kind(),
        SpecErrorKind::Io(_)
    ));
    let binary = dir.put("binary.toml", "");
    fs::write(&binary, [0xff, 0xfe, 0x00]).unwrap();
    assert!(
        read_toml_file(&binary)
            .unwrap_err()
            .to_string()
            .contains("not UTF-8")
    );
    assert!(
        read_numactl_file(dir.path()).is_err(),
        "a directory is not a file"
    );
}

#[test]
fn malformed_files_give_one_line_errors() {
    let cases = [
        "",
        "distances = [[10]]",
        "distances = [[10]]\n[[node]]\nid = 0\nmemory = \"1G\"\nextra = true",
        "distances = [[10]]\n[[node]]\nid = 0\nmemory = \"1G\"\n[[node]]\nid = 0\nmemory = \"1G\"",
        "distances = [[10]]\n[[node]]\nid = 0\nmemory = \"1G\"\ncpus = \"3-1\"",
        "distances = [[10]]\n[[node]]\nid = 0\nmemory = \"1G\"\ninitiator = 0",
        "distances = [[10]]\n[[node]]\nid = 0\nmemory = \"1G\"\nsocket = \"zero\"",
        "distances = [[10]]\n[[node]]\nid = 0\nmemory = \"1G\n",
        "[[node]\n",
        "distances = \"10\"\n[[node]]\nid = 0\nmemory = \"1G\"",
    ];
    for text in cases {
        let e = parse_toml(text).unwrap_err().to_string();
        assert!(!e.is_empty() && !e.contains('\n'), "{text:?}: {e:?}");
    }
    for text in [
        "",
        "available: 1 nodes (0)\n",
        "node 0 cpus: 0\n",
        "available: x nodes (0)\n",
        "garbage\n\0\n",
    ] {
        let e = parse_numactl(text).unwrap_err().to_string();
        assert!(!e.is_empty() && !e.contains('\n'), "{text:?}: {e:?}");
    }
}

/// A mutated copy of `text`: truncated, a span deleted or duplicated, bytes replaced by
/// characters that matter to the formats, or two lines swapped.
fn mutate(text: &str, rng: &mut Rng) -> String {
    const ALPHABET: &[u8] = b"0123456789-,:=[]{}\"'#\n\r\t .xGMKTB-_node";
    let mut b = text.as_bytes().to_vec();
    for _ in 0..=rng.index(3) {
        let len = b.len().max(1);
        match rng.index(6) {
            0 => b.truncate(rng.index(len)),
            1 => {
                let at = rng.index(len);
                let end = (at + rng.index(16)).min(b.len());
                b.drain(at.min(b.len())..end);
            }
            2 => {
                let at = rng.index(len).min(b.len());
                let end = (at + rng.index(32)).min(b.len());
                let copy = b[at..end].to_vec();
                b.splice(at..at, copy);
            }
            3 | 4 => {
                if !b.is_empty() {
                    let at = rng.index(b.len());
                    b[at] = ALPHABET[rng.index(ALPHABET.len())];
                }
            }
            _ => {
                let mut lines: Vec<&[u8]> = b.split(|&c| c == b'\n').collect();
                if lines.len() > 1 {
                    let (i, j) = (rng.index(lines.len()), rng.index(lines.len()));
                    lines.swap(i, j);
                }
                b = lines.join(&b'\n');
            }
        }
    }
    String::from_utf8_lossy(&b).into_owned()
}

#[test]
fn mutated_inputs_never_panic() {
    let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15);
    let mut accepted = 0;
    for s in presets().iter().filter(|s| s.len() <= 8) {
        let (toml, numactl) = (to_toml(s), to_numactl(s));
        for _ in 0..1500 {
            for result in [
                parse_toml(&mutate(&toml, &mut rng)),
                parse_numactl(&mutate(&numactl, &mut rng)),
            ] {
                match result {
                    Ok(spec) => {
                        accepted += 1;
                        // Whatever was accepted is a valid machine the core can use.
                        let _ = spec.fallback_orders(FallbackOptions::default());
                    }
                    Err(e) => assert!(!e.to_string().contains('\n'), "{e:?}"),
                }
            }
        }
    }
    assert!(
        accepted > 0,
        "some mutations (in comments, free lines) stay valid"
    );
}

#[test]
fn cpulist_and_size_parsers() {
    assert_eq!(
        parse_cpulist("0-3,8,10-11").unwrap(),
        [0, 1, 2, 3, 8, 10, 11]
    );
    assert!(parse_cpulist("").unwrap().is_empty());
    assert!(parse_cpulist("3-").is_err());
    assert!(parse_cpulist("99999999999").is_err());
    assert_eq!(parse_size("16G"), Ok(16 << 30));
    assert_eq!(parse_size("0"), Ok(0));
    assert_eq!(parse_size("123"), Ok(123));
    assert!(parse_size("17000000T").is_err(), "overflow is an error");
    assert!(parse_size("16X").is_err());
}

#[test]
fn fake_sysfs_round_trip() {
    for s in presets() {
        let dir = TempDir::new(s.name());
        to_sysfs(&s, &dir);
        let back = read_sysfs(dir.path()).unwrap_or_else(|e| panic!("{}: {e}", s.name()));
        assert_eq!(shape(&back), shape(&s), "{}", s.name());
        let sockets = |m: &MachineSpec| {
            m.nodes()
                .iter()
                .map(|n| if n.cpus.is_empty() { None } else { n.socket })
                .collect::<Vec<_>>()
        };
        assert_eq!(
            sockets(&back),
            sockets(&s),
            "{}: CPU nodes' sockets from physical_package_id",
            s.name()
        );
        assert!(back.name().starts_with("sysfs:"));
    }
}

#[test]
fn fake_sysfs_errors() {
    let s = preset("amd-4node").unwrap();
    let dir = TempDir::new("errors");
    to_sysfs(&s, &dir);
    dir.put("node1/distance", "12 10 32\n");
    let e = read_sysfs(dir.path()).unwrap_err().to_string();
    assert!(e.contains("node1/distance") && !e.contains('\n'), "{e}");
    dir.put("node1/distance", "12 10 32 32\n");
    fs::rename(dir.path().join("node3"), dir.path().join("node9")).unwrap();
    let e = read_sysfs(dir.path()).unwrap_err().to_string();
    assert!(e.contains("consecutive node ids"), "{e}");
    assert!(read_sysfs(&dir.path().join("nope")).is_err());
}

#[test]
fn this_machines_sysfs() {
    let dir = Path::new(DEFAULT_SYSFS_DIR);
    if !dir.is_dir() {
        eprintln!("no {DEFAULT_SYSFS_DIR}; skipped");
        return;
    }
    let s = read_sysfs(dir).unwrap_or_else(|e| panic!("{e}"));
    let node_dirs = fs::read_dir(dir)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name().to_str().is_some_and(|n| {
                n.strip_prefix("node")
                    .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
            })
        })
        .count();
    assert_eq!(s.len(), node_dirs);
    assert!(s.total_memory_bytes() > 0);
    assert!(s.nodes().iter().any(|n| !n.cpus.is_empty()));
    let orders = s.fallback_orders(FallbackOptions::default());
    assert!(orders.iter().all(|o| !o.is_empty()));
}
