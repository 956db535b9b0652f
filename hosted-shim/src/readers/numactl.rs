//! The text `numactl --hardware` prints:
//!
//! ```text
//! available: 2 nodes (0-1)
//! node 0 cpus: 0 1 2 3
//! node 0 size: 15950 MB
//! node 0 free: 12000 MB
//! node 1 cpus:
//! node 1 size: 0 MB
//! node 1 free: 0 MB
//! node distances:
//! node   0   1
//!   0:  10  21
//!   1:  21  10
//! ```
//!
//! Sizes are MiB (numactl prints `size >> 20` and calls it MB). `free` lines are checked for
//! form and otherwise ignored. numactl knows nothing of sockets, initiators or bandwidth, so
//! those stay unset.
//!
//! Sparse node ids (`available: 2 nodes (0,2)`, which real machines with offline nodes print)
//! are **rejected** with an error saying so: numaframe numbers nodes `0..n`, and renumbering
//! would make its output disagree with the node numbers the user sees everywhere else. Any line
//! the format does not have is an error too.
#![deny(unsafe_code)]

use std::path::Path;

use super::{name_from_path, read_text};
use crate::spec::{
    MAX_CPU_ID, MachineSpec, NodeSpec, SpecError, parse_cpulist, parse_decimal, shorten,
};

/// What the node lines said about one node.
#[derive(Default)]
struct Partial {
    cpus: Option<Vec<u32>>,
    size: Option<u64>,
    free: bool,
}

enum Section {
    Nodes,
    DistanceHeader,
    DistanceRows,
}

/// Parses `numactl --hardware` output (the machine is named `numactl`).
///
/// # Errors
/// A [`SpecError`] with the line of the first problem: a missing or repeated `available:` line,
/// sparse node ids, an unknown line, a bad number, a node without its `cpus:` or `size:` line,
/// a distance table that is not `n × n` over ids `0..n`, or a topology the core rejects.
pub fn parse_numactl(text: &str) -> Result<MachineSpec, SpecError> {
    let mut nodes: Option<Vec<Partial>> = None;
    let mut rows: Vec<Option<Vec<u8>>> = Vec::new();
    let mut section = Section::Nodes;

    for (index, raw) in text.lines().enumerate() {
        let at = index + 1;
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        let unexpected =
            || SpecError::syntax(format!("unexpected line {:?}", shorten(line))).at_line(at);
        if line.starts_with("No NUMA available") {
            return Err(SpecError::invalid("numactl reports no NUMA on this system").at_line(at));
        }
        let Some(parts) = nodes.as_mut() else {
            let rest = line.strip_prefix("available:").ok_or_else(|| {
                SpecError::syntax(format!(
                    "expected `available: N nodes (LIST)` first, found {:?}",
                    shorten(line)
                ))
                .at_line(at)
            })?;
            let count = parse_available(rest).map_err(|e| e.at_line(at))?;
            nodes = Some((0..count).map(|_| Partial::default()).collect());
            rows = vec![None; count];
            continue;
        };
        let n = parts.len();
        match section {
            Section::Nodes if line == "node distances:" => section = Section::DistanceHeader,
            Section::Nodes => {
                if line.starts_with("available:") {
                    return Err(SpecError::syntax("second `available:` line").at_line(at));
                }
                let mut tokens = line.split_whitespace();
                if tokens.next() != Some("node") {
                    return Err(unexpected());
                }
                let id = node_id(tokens.next().unwrap_or(""), n).map_err(|e| e.at_line(at))?;
                let part = &mut parts[id];
                let key = tokens.next().unwrap_or("");
                let rest: Vec<&str> = tokens.collect();
                let twice =
                    || SpecError::syntax(format!("second `node {id} {key}` line")).at_line(at);
                match key {
                    "cpus:" => {
                        if part.cpus.is_some() {
                            return Err(twice());
                        }
                        part.cpus = Some(cpus(&rest, id).map_err(|e| e.at_line(at))?);
                    }
                    "size:" => {
                        if part.size.is_some() {
                            return Err(twice());
                        }
                        part.size = Some(megabytes(&rest, id, "size").map_err(|e| e.at_line(at))?);
                    }
                    "free:" => {
                        if part.free {
                            return Err(twice());
                        }
                        megabytes(&rest, id, "free").map_err(|e| e.at_line(at))?;
                        part.free = true;
                    }
                    _ => return Err(unexpected()),
                }
            }
            Section::DistanceHeader => {
                let mut tokens = line.split_whitespace();
                if tokens.next() != Some("node") {
                    return Err(SpecError::syntax(format!(
                        "expected the distance header `node 0 1 …`, found {:?}",
                        shorten(line)
                    ))
                    .at_line(at));
                }
                let columns: Vec<&str> = tokens.collect();
                let in_order = columns.len() == n
                    && columns
                        .iter()
                        .enumerate()
                        .all(|(i, c)| parse_decimal(c) == Some(i as u64));
                if !in_order {
                    return Err(SpecError::syntax(format!(
                        "distance header must list nodes 0..{} in order, found {:?}",
                        n - 1,
                        shorten(line)
                    ))
                    .at_line(at));
                }
                section = Section::DistanceRows;
            }
            Section::DistanceRows => {
                let mut tokens = line.split_whitespace();
                let label = tokens.next().unwrap_or("");
                let Some(id) = label.strip_suffix(':') else {
                    return Err(SpecError::syntax(format!(
                        "expected a distance row `K: d d …`, found {:?}",
                        shorten(line)
                    ))
                    .at_line(at));
                };
                let id = node_id(id, n).map_err(|e| e.at_line(at))?;
                let values: Vec<&str> = tokens.collect();
                if values.len() != n {
                    return Err(SpecError::syntax(format!(
                        "distance row {id} has {} entries, expected {n}",
                        values.len()
                    ))
                    .at_line(at));
                }
                let row: Option<Vec<u8>> = values
                    .iter()
                    .map(|v| parse_decimal(v).and_then(|d| u8::try_from(d).ok()))
                    .collect();
                let row = row.ok_or_else(|| {
                    SpecError::syntax(format!(
                        "distance row {id}: entries must be numbers 0..=255"
                    ))
                    .at_line(at)
                })?;
                if rows[id].replace(row).is_some() {
                    return Err(
                        SpecError::syntax(format!("second distance row for node {id}")).at_line(at),
                    );
                }
            }
        }
    }

    let parts = nodes.ok_or_else(|| SpecError::syntax("no `available: N nodes (LIST)` line"))?;
    let mut specs = Vec::with_capacity(parts.len());
    for (id, part) in parts.into_iter().enumerate() {
        let missing = |what: &str| SpecError::syntax(format!("node {id} has no `{what}` line"));
        let cpus = part.cpus.ok_or_else(|| missing("cpus:"))?;
        let memory_bytes = part.size.ok_or_else(|| missing("size:"))?;
        specs.push(NodeSpec {
            cpus,
            memory_bytes,
            ..NodeSpec::default()
        });
    }
    let mut distances = Vec::with_capacity(rows.len() * rows.len());
    for (id, row) in rows.into_iter().enumerate() {
        let row = row.ok_or_else(|| {
            SpecError::syntax(format!(
                "no distance row for node {id} (is the `node distances:` table missing?)"
            ))
        })?;
        distances.extend(row);
    }
    MachineSpec::new("numactl", specs, distances, None)
}

/// `2 nodes (0-1)` → 2, rejecting sparse ids.
fn parse_available(rest: &str) -> Result<usize, SpecError> {
    let bad = || {
        SpecError::syntax(format!(
            "expected `available: N nodes (LIST)`, found {:?}",
            shorten(rest.trim())
        ))
    };
    let tokens: Vec<&str> = rest.split_whitespace().collect();
    let [count, "nodes" | "node", list] = tokens[..] else {
        return Err(bad());
    };
    let count = parse_decimal(count).ok_or_else(bad)?;
    let list = list
        .strip_prefix('(')
        .and_then(|l| l.strip_suffix(')'))
        .ok_or_else(bad)?;
    let ids =
        parse_cpulist(list).map_err(|e| SpecError::cpulist("available node list", list, e))?;
    if ids.len() as u64 != count {
        return Err(SpecError::syntax(format!(
            "`available:` says {count} nodes but lists {}",
            ids.len()
        )));
    }
    if ids.is_empty() {
        return Err(SpecError::invalid("no nodes available"));
    }
    if ids.iter().enumerate().any(|(i, &id)| id as usize != i) {
        return Err(SpecError::invalid(format!(
            "node ids ({list}) are not 0..{}: numaframe needs consecutive node ids, renumber the nodes",
            ids.len() - 1
        )));
    }
    if ids.len() > numaframe::MAX_NODES {
        return Err(numaframe::TopologyError::TooManyNodes { nodes: ids.len() }.into());
    }
    Ok(ids.len())
}

/// A node id token that must name one of the `n` nodes.
fn node_id(token: &str, n: usize) -> Result<usize, SpecError> {
    match parse_decimal(token) {
        Some(id) if id < n as u64 => Ok(id as usize),
        Some(id) => Err(SpecError::invalid(format!(
            "node {id} is not in the `available:` list (0..{})",
            n - 1
        ))),
        None => Err(SpecError::syntax(format!(
            "expected a node id, found {:?}",
            shorten(token)
        ))),
    }
}

/// `0 1 2 3` (space-separated, unlike a cpulist).
fn cpus(tokens: &[&str], id: usize) -> Result<Vec<u32>, SpecError> {
    tokens
        .iter()
        .map(|t| match parse_decimal(t) {
            Some(c) if c <= u64::from(MAX_CPU_ID) => Ok(c as u32),
            _ => Err(SpecError::syntax(format!(
                "node {id} cpus: {:?} is not a CPU number 0..={MAX_CPU_ID}",
                shorten(t)
            ))),
        })
        .collect()
}

/// `15950 MB` → bytes.
fn megabytes(tokens: &[&str], id: usize, what: &str) -> Result<u64, SpecError> {
    let bad = || {
        SpecError::syntax(format!(
            "node {id} {what}: expected `N MB`, found {:?}",
            shorten(&tokens.join(" "))
        ))
    };
    let [number, "MB"] = tokens else {
        return Err(bad());
    };
    let mb = parse_decimal(number).ok_or_else(bad)?;
    mb.checked_mul(1 << 20).ok_or_else(|| {
        SpecError::invalid(format!("node {id} {what}: {mb} MB does not fit in 64 bits"))
    })
}

/// Reads and parses a saved `numactl --hardware` output; the machine is named after the file's
/// stem, and errors name the file.
///
/// # Errors
/// As [`parse_numactl`], plus the file cannot be read, is not UTF-8 or exceeds
/// [`MAX_INPUT_BYTES`](super::MAX_INPUT_BYTES).
pub fn read_numactl_file(path: &Path) -> Result<MachineSpec, SpecError> {
    let text = read_text(path)?;
    let mut spec = parse_numactl(&text).map_err(|e| e.in_file(path.display().to_string()))?;
    spec.set_name(name_from_path(path, "numactl"));
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use numaframe::NodeId;
    use numaframe_testkit::samples::NUMACTL_TWO_NODES as TWO;

    use super::*;

    #[test]
    fn parses_example() {
        let s = parse_numactl(TWO).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s.nodes()[0].cpus, [0, 1, 2, 3]);
        assert_eq!(s.nodes()[0].memory_bytes, 15950 << 20);
        assert!(s.nodes()[1].cpus.is_empty());
        assert_eq!(s.nodes()[1].memory_bytes, 0);
        assert_eq!(s.distance(NodeId::new(0), NodeId::new(1)), Some(21));
        assert_eq!(s.name(), "numactl");
    }

    #[test]
    fn tolerates_crlf_blank_lines_and_one_node() {
        let crlf = TWO.replace('\n', "\r\n\r\n");
        assert_eq!(parse_numactl(&crlf).unwrap(), parse_numactl(TWO).unwrap());
        let one = "available: 1 nodes (0)\nnode 0 cpus: 0 1\nnode 0 size: 3911 MB\nnode 0 free: 100 MB\nnode distances:\nnode   0 \n  0:  10 \n";
        assert_eq!(parse_numactl(one).unwrap().len(), 1);
    }

    fn err(text: &str) -> String {
        match parse_numactl(text) {
            Ok(s) => panic!("accepted {text:?}: {s:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn malformed() {
        let with = |from: &str, to: &str| TWO.replacen(from, to, 1);
        let cases: Vec<(String, &str)> = vec![
            (String::new(), "no `available: N nodes (LIST)` line"),
            (
                "No NUMA available on this system\n".into(),
                "line 1: numactl reports no NUMA",
            ),
            (
                with("available: 2 nodes (0-1)", "available: 2 nodes (0,2)"),
                "line 1: node ids (0,2) are not 0..1: numaframe needs consecutive node ids",
            ),
            (
                with("available: 2 nodes (0-1)", "available: 3 nodes (0-1)"),
                "line 1: `available:` says 3 nodes but lists 2",
            ),
            (
                with("available: 2 nodes (0-1)", "available: 2 nodes 0-1"),
                "line 1: expected `available:",
            ),
            (
                with("available: 2 nodes (0-1)", "available: 0 nodes ()"),
                "line 1: no nodes available",
            ),
            (
                with("available: 2 nodes (0-1)", "available: 2 nodes (0-x)"),
                "line 1: available node list: bad list",
            ),
            (
                with("available", "availabl"),
                "line 1: expected `available: N nodes (LIST)` first",
            ),
            (
                format!("{TWO}available: 2 nodes (0-1)\n"),
                "line 12: expected a node id, found \"available\"",
            ),
            (
                with("node 0 cpus: 0 1 2 3", "node 0 cpus: 0 1 x 3"),
                "line 2: node 0 cpus: \"x\" is not a CPU number",
            ),
            (
                with("node 0 cpus: 0 1 2 3", "node 0 cpus: 0-3"),
                "line 2: node 0 cpus: \"0-3\"",
            ),
            (
                with("node 0 cpus: 0 1 2 3", "node 2 cpus: 0"),
                "line 2: node 2 is not in the `available:` list",
            ),
            (
                with("node 0 cpus: 0 1 2 3", "node x cpus: 0"),
                "line 2: expected a node id",
            ),
            (
                with("node 0 cpus: 0 1 2 3", "node 0 cpu: 0"),
                "line 2: unexpected line",
            ),
            (
                with("node 0 cpus: 0 1 2 3", "nodes 0 cpus: 0"),
                "line 2: unexpected line",
            ),
            (
                with("node 0 cpus: 0 1 2 3\n", ""),
                "node 0 has no `cpus:` line",
            ),
            (
                with("node 0 size: 15950 MB", "node 0 cpus: 9"),
                "line 3: second `node 0 cpus:` line",
            ),
            (
                with("node 0 size: 15950 MB\n", ""),
                "node 0 has no `size:` line",
            ),
            (
                with("node 0 size: 15950 MB", "node 0 size: 15950 GB"),
                "line 3: node 0 size: expected `N MB`",
            ),
            (
                with("node 0 size: 15950 MB", "node 0 size: 99999999999999999 MB"),
                "does not fit in 64 bits",
            ),
            (
                with("node 0 free: 12000 MB", "node 0 free: lots"),
                "line 4: node 0 free: expected `N MB`",
            ),
            (
                with(
                    "node 0 free: 12000 MB",
                    "node 0 free: 1 MB\nnode 0 free: 1 MB",
                ),
                "line 5: second `node 0 free:` line",
            ),
            (with("node distances:\n", ""), "line 8: unexpected line"),
            (
                with("node   0   1", "node   1   0"),
                "line 9: distance header must list nodes 0..1 in order",
            ),
            (with("node   0   1", "node   0"), "line 9: distance header"),
            (
                with("node   0   1", "  0:  10  21"),
                "line 9: expected the distance header",
            ),
            (
                with("  1:  21  10", "  0:  21  10"),
                "line 11: second distance row for node 0",
            ),
            (with("  1:  21  10\n", ""), "no distance row for node 1"),
            (
                with("  1:  21  10", "  1:  21"),
                "line 11: distance row 1 has 1 entries",
            ),
            (
                with("  1:  21  10", "  1   21  10"),
                "line 11: expected a distance row",
            ),
            (
                with("  1:  21  10", "  1:  256  10"),
                "line 11: distance row 1: entries must be numbers 0..=255",
            ),
            (
                with("  1:  21  10", "  7:  21  10"),
                "line 11: node 7 is not in",
            ),
            (
                with("  1:  21  10", "  1:  21  11"),
                "invalid topology: distance 1->1 is 11",
            ),
            (
                with("node 1 cpus:", "node 1 cpus: 3"),
                "CPU 3 is in node 0 and in node 1",
            ),
        ];
        for (text, want) in &cases {
            let got = err(text);
            assert!(got.contains(want), "{text:?}: got {got:?}, want {want:?}");
        }
    }

    #[test]
    fn truncations_never_panic() {
        for end in 0..=TWO.len() {
            let _ = parse_numactl(&TWO[..end]);
        }
    }
}
