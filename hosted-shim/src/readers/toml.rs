//! The TOML machine description of docs/ ("Hosted CLI contract"):
//!
//! ```toml
//! distances = [[10, 12], [12, 10]]   # row i = distances from node i
//! socket_link_gbps = 150             # optional: bandwidth between sockets
//! [[node]]
//! id = 0
//! cpus = "0-3"          # cpulist; omit or "" for a CPU-less node
//! memory = "16G"        # K/M/G/T suffixes or plain bytes (string or integer); "0" = memoryless
//! socket = 0            # optional package id
//! initiator = 0         # optional: the CPU node owning a CPU-less node
//! bandwidth_gbps = 300  # optional: input to auto weights
//! ```
//!
//! `[[node]]` tables may come in any order, but their ids must be exactly `0..n`, each once.
//! Unknown keys are errors, so a typo cannot silently drop a setting. Errors name the line.
#![deny(unsafe_code)]

use std::ops::Range;
use std::path::Path;

use ::toml::{Spanned, Value};
use numaframe::{MAX_NODES, NodeId, TopologyError};
use serde::Deserialize;

use super::{line_of, name_from_path, read_text};
use crate::spec::{
    CpuOwners, MachineSpec, NodeSpec, SpecError, SpecErrorKind, parse_cpulist, parse_size,
};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileRepr {
    distances: Spanned<Vec<Spanned<Vec<u8>>>>,
    node: Vec<Spanned<NodeRepr>>,
    socket_link_gbps: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeRepr {
    id: Spanned<u64>,
    cpus: Option<Spanned<String>>,
    memory: Spanned<Value>,
    socket: Option<u16>,
    initiator: Option<Spanned<u64>>,
    bandwidth_gbps: Option<u32>,
}

/// Parses a TOML machine description (the machine is named `toml`).
///
/// # Errors
/// A [`SpecError`] with the line of the first problem: TOML syntax, an unknown or missing key, a
/// value of the wrong type or range, node ids that are not `0..n` each once, a distance table
/// that is not `n × n`, a bad cpulist or size, or a topology the core rejects.
pub fn parse_toml(text: &str) -> Result<MachineSpec, SpecError> {
    let line = |span: Range<usize>| line_of(text, span.start);
    let file: FileRepr = ::toml::from_str(text).map_err(|e| {
        let err = SpecError::syntax(e.message().trim().replace('\n', "; "));
        match e.span() {
            Some(span) => err.at_line(line(span)),
            None => err,
        }
    })?;

    let n = file.node.len();
    if n == 0 {
        return Err(SpecError::syntax("no [[node]] tables"));
    }
    if n > MAX_NODES {
        return Err(TopologyError::TooManyNodes { nodes: n }.into());
    }

    // Node ids: exactly 0..n, each once, in any order.
    let mut slots: Vec<Option<usize>> = vec![None; n];
    for (pos, node) in file.node.iter().enumerate() {
        let id = *node.get_ref().id.get_ref();
        let at = line(node.get_ref().id.span());
        let Some(slot) = usize::try_from(id).ok().and_then(|i| slots.get_mut(i)) else {
            return Err(SpecError::invalid(format!(
                "node id {id} out of range: {n} [[node]] tables need ids 0..={}",
                n - 1
            ))
            .at_line(at));
        };
        if let Some(prev) = *slot {
            let prev_line = line(file.node[prev].get_ref().id.span());
            return Err(SpecError::invalid(format!(
                "node id {id} given twice (first on line {prev_line})"
            ))
            .at_line(at));
        }
        *slot = Some(pos);
    }
    // Every slot is filled: n distinct ids below n.
    let order: Vec<&Spanned<NodeRepr>> =
        slots.iter().flatten().map(|&pos| &file.node[pos]).collect();

    // Distances: n rows of n.
    let rows = file.distances.get_ref();
    if rows.len() != n {
        let msg = format!(
            "distances has {} rows, expected {n} (one per [[node]])",
            rows.len()
        );
        return Err(SpecError::invalid(msg).at_line(line(file.distances.span())));
    }
    let mut distances = Vec::with_capacity(n * n);
    for (i, row) in rows.iter().enumerate() {
        if row.get_ref().len() != n {
            let msg = format!(
                "distances row {i} has {} entries, expected {n} (one per [[node]])",
                row.get_ref().len()
            );
            return Err(SpecError::invalid(msg).at_line(line(row.span())));
        }
        distances.extend_from_slice(row.get_ref());
    }

    let mut nodes = Vec::with_capacity(n);
    let mut owners = CpuOwners::default();
    for (id, node) in order.iter().enumerate() {
        let node = node.get_ref();
        let cpus = match &node.cpus {
            Some(c) => {
                let at = |e: SpecError| e.at_line(line(c.span()));
                let cpus = parse_cpulist(c.get_ref()).map_err(|e| {
                    at(SpecError::cpulist(
                        format!("node {id} cpus"),
                        c.get_ref(),
                        e,
                    ))
                })?;
                owners.claim(id, &cpus).map_err(at)?;
                cpus
            }
            None => Vec::new(),
        };
        let memory_bytes = memory(node, id).map_err(|e| e.at_line(line(node.memory.span())))?;
        let initiator = match &node.initiator {
            Some(init) => {
                let target = usize::try_from(*init.get_ref())
                    .ok()
                    .filter(|&t| t < n)
                    .and_then(NodeId::try_new);
                let msg = || {
                    format!(
                        "node {id} initiator {} is not a node of this machine",
                        init.get_ref()
                    )
                };
                Some(target.ok_or_else(|| SpecError::invalid(msg()).at_line(line(init.span())))?)
            }
            None => None,
        };
        nodes.push(NodeSpec {
            cpus,
            memory_bytes,
            socket: node.socket,
            initiator,
            bandwidth_gbps: node.bandwidth_gbps,
        });
    }

    MachineSpec::new("toml", nodes, distances, file.socket_link_gbps).map_err(|e| {
        // Point topology errors at the line they are about.
        let span = match e.kind() {
            SpecErrorKind::Topology(TopologyError::BadDistance { from, .. }) => {
                rows.get(from.index()).map(Spanned::span)
            }
            SpecErrorKind::Topology(
                TopologyError::InitiatorOnCpuNode { node }
                | TopologyError::BadInitiator { node, .. },
            ) => order.get(node.index()).map(|n| n.get_ref().id.span()),
            _ => None,
        };
        match span {
            Some(span) => e.at_line(line(span)),
            None => e,
        }
    })
}

/// `memory = "16G"` or `memory = 17179869184`.
fn memory(node: &NodeRepr, id: usize) -> Result<u64, SpecError> {
    let field = || format!("node {id} memory");
    match node.memory.get_ref() {
        Value::String(s) => parse_size(s).map_err(|e| SpecError::size(field(), s, e)),
        Value::Integer(b) => u64::try_from(*b)
            .map_err(|_| SpecError::invalid(format!("{}: {b} is negative", field()))),
        other => Err(SpecError::syntax(format!(
            "{}: expected a size like \"16G\" or a byte count, found a {}",
            field(),
            other.type_str()
        ))),
    }
}

/// Reads and parses a TOML machine description; the machine is named after the file's stem, and
/// errors name the file.
///
/// # Errors
/// As [`parse_toml`], plus the file cannot be read, is not UTF-8 or exceeds
/// [`MAX_INPUT_BYTES`](super::MAX_INPUT_BYTES).
pub fn read_toml_file(path: &Path) -> Result<MachineSpec, SpecError> {
    let text = read_text(path)?;
    let mut spec = parse_toml(&text).map_err(|e| e.in_file(path.display().to_string()))?;
    spec.set_name(name_from_path(path, "toml"));
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CXL: &str = r#"
distances = [[10, 21, 14, 24], [21, 10, 24, 14], [14, 24, 10, 34], [24, 14, 34, 10]]
socket_link_gbps = 150

[[node]]
id = 2
memory = "32G"
socket = 0
initiator = 0
bandwidth_gbps = 100

[[node]]
id = 0
cpus = "0-15"
memory = "64G"
socket = 0
bandwidth_gbps = 300

[[node]]
id = 1
cpus = "16-31"
memory = 68719476736
socket = 1
bandwidth_gbps = 300

[[node]]
id = 3
cpus = ""
memory = "32g"
socket = 1
initiator = 1
bandwidth_gbps = 100
"#;

    #[test]
    fn parses_any_node_order() {
        let s = parse_toml(CXL).unwrap();
        assert_eq!(s.len(), 4);
        assert_eq!(s.nodes()[0].cpus, (0..16).collect::<Vec<_>>());
        assert_eq!(s.nodes()[1].memory_bytes, 64 << 30);
        assert!(s.nodes()[2].cpus.is_empty());
        assert_eq!(s.nodes()[2].initiator, Some(NodeId::new(0)));
        assert_eq!(s.nodes()[3].bandwidth_gbps, Some(100));
        assert_eq!(s.socket_link_gbps(), Some(150));
        assert_eq!(s.distance(NodeId::new(2), NodeId::new(3)), Some(34));
        assert_eq!(
            s,
            crate::presets::preset("cxl-2socket")
                .map(|mut p| {
                    p.set_name("toml");
                    p
                })
                .unwrap()
        );
    }

    fn err(text: &str) -> String {
        match parse_toml(text) {
            Ok(s) => panic!("accepted: {s:?}"),
            Err(e) => e.to_string(),
        }
    }

    const ONE: &str = "distances = [[10]]\n[[node]]\nid = 0\ncpus = \"0\"\nmemory = \"1G\"\n";

    #[test]
    fn minimal() {
        let s = parse_toml(ONE).unwrap();
        assert_eq!(s.nodes()[0].memory_bytes, 1 << 30);
        assert_eq!(s.socket_link_gbps(), None);
    }

    #[test]
    fn malformed() {
        let cases: &[(&str, &str)] = &[
            ("", "missing field `distances`"),
            ("distances = [[10]]", "missing field `node`"),
            ("distances = [[10]]\nnode = []", "no [[node]] tables"),
            ("distances = [[10]\n", "line 1:"),
            (
                "distances = [[10]]\nbogus = 1\n[[node]]\nid = 0\nmemory = \"1G\"",
                "line 2: unknown field `bogus`",
            ),
            (
                "distances = [[10]]\n[[node]]\nid = 0\nmemory = \"1G\"\ncpu = \"0\"",
                "line 5: unknown field `cpu`",
            ),
            (
                "distances = [[10]]\n[[node]]\nid = 0",
                "missing field `memory`",
            ),
            (
                "distances = [[10]]\n[[node]]\nmemory = \"1G\"",
                "missing field `id`",
            ),
            (
                "distances = [[10]]\n[[node]]\nid = 1\nmemory = \"1G\"",
                "line 3: node id 1 out of range",
            ),
            (
                "distances = [[10]]\n[[node]]\nid = -1\nmemory = \"1G\"",
                "line 3:",
            ),
            (
                "distances = [[10,20],[20,10]]\n[[node]]\nid = 0\nmemory = \"1G\"\n[[node]]\nid = 0\nmemory = \"1G\"",
                "line 6: node id 0 given twice (first on line 3)",
            ),
            (
                "distances = [[10],\n[10]]\n[[node]]\nid = 0\nmemory = \"1G\"",
                "line 1: distances has 2 rows, expected 1 (one per [[node]])",
            ),
            (
                "distances = [[10,20]]\n[[node]]\nid = 0\nmemory = \"1G\"",
                "line 1: distances row 0 has 2 entries, expected 1",
            ),
            (
                "distances = [[10,20],\n[20]]\n[[node]]\nid = 0\nmemory = \"1G\"\n[[node]]\nid = 1\nmemory = \"1G\"",
                "line 2: distances row 1 has 1 entries",
            ),
            (
                "distances = [[10,20],[20,10]]\n[[node]]\nid = 0\nmemory = \"1G\"\n[[node]]\nid = 1\nmemory = \"1G\"\ncpus=\"0-x\"",
                "line 8: node 1 cpus: bad list \"0-x\"",
            ),
            (
                "distances = [[10]]\n[[node]]\nid = 0\nmemory = \"1Q\"",
                "line 4: node 0 memory: bad size \"1Q\": unknown suffix",
            ),
            (
                "distances = [[10]]\n[[node]]\nid = 0\nmemory = -5",
                "line 4: node 0 memory: -5 is negative",
            ),
            (
                "distances = [[10]]\n[[node]]\nid = 0\nmemory = 1.5",
                "line 4: node 0 memory: expected a size",
            ),
            (
                "distances = [[10]]\n[[node]]\nid = 0\nmemory = \"99999999T\"",
                "does not fit in 64 bits",
            ),
            (
                "distances = [[300]]\n[[node]]\nid = 0\nmemory = \"1G\"",
                "line 1:",
            ),
            (
                "distances = [[11]]\n[[node]]\nid = 0\nmemory = \"1G\"",
                "line 1: invalid topology: distance 0->0 is 11",
            ),
            (
                "distances = [[10,20],[20,10]]\n[[node]]\nid = 0\nmemory = \"1G\"\n[[node]]\nid = 1\nmemory = \"1G\"\ninitiator = 0",
                "line 6: invalid topology: node 1 names initiator 0",
            ),
            (
                "distances = [[10]]\n[[node]]\nid = 0\nmemory = \"1G\"\ninitiator = 7",
                "line 5: node 0 initiator 7 is not a node",
            ),
            (
                "distances = [[10]]\n[[node]]\nid = 0\nmemory = \"1G\"\nsocket = 70000",
                "line 5:",
            ),
            (
                "distances = [[10]]\n[[node]]\nid = 0\nmemory = \"1G\"\ncpus = 3",
                "line 5: invalid type: integer `3`, expected a string",
            ),
            (
                "distances = [[10]]\n[[node]]\nid = 0\nmemory = \"1G\"\nbandwidth_gbps = 0",
                "bandwidth_gbps 0",
            ),
            (
                "distances = [[10]]\nsocket_link_gbps = -1\n[[node]]\nid = 0\nmemory = \"1G\"",
                "line 2:",
            ),
            (
                "distances = [[10,20],[20,10]]\n[[node]]\nid = 0\ncpus=\"0\"\nmemory = \"1G\"\n[[node]]\nid = 1\nmemory = \"1G\"\ncpus=\"0\"",
                // Refused at the second node's list, before any later list is expanded.
                "line 9: CPU 0 is in node 0 and in node 1",
            ),
        ];
        for (text, want) in cases {
            let got = err(text);
            assert!(got.contains(want), "{text:?}: got {got:?}, want {want:?}");
            assert!(!got.contains('\n'), "{got:?}");
        }
    }

    #[test]
    fn deep_nesting_is_an_error() {
        let text = format!("distances = {}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(parse_toml(&text).is_err());
    }

    #[test]
    fn truncations_never_panic() {
        for end in 0..=CXL.len() {
            if CXL.is_char_boundary(end) {
                let _ = parse_toml(&CXL[..end]);
            }
        }
    }
}
