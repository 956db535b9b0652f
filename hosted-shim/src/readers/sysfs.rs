//! Linux's node directory, `/sys/devices/system/node` (or a copy of it anywhere).
//!
//! What is read, per node `N` (directories `nodeN`, whose ids must be exactly `0..n`):
//! - `nodeN/distance`: the distance row, space-separated (required);
//! - `nodeN/cpulist`: the node's CPUs (required);
//! - `nodeN/meminfo`: the line `Node N MemTotal: <kB> kB` (required);
//! - `has_cpu`, `has_memory` at the top (optional node lists): when present they decide which
//!   nodes have CPUs and memory. A node they leave out gets no CPUs or no memory whatever its
//!   own files say; a node they list whose `cpulist` is empty or whose `MemTotal` is 0 is an
//!   error, since sysfs then contradicts itself;
//! - `nodeN/cpuK/topology/physical_package_id` for the node's first CPU (optional): the socket.
//!   A CPU-less node takes its initiator's socket;
//! - `nodeN/access0/initiators/` (optional, from ACPI HMAT): the lowest `nodeM` entry that is a
//!   CPU node becomes a CPU-less node's initiator, and `min(read_bandwidth, write_bandwidth)`
//!   (MB/s) the node's bandwidth in GB/s.
//!
//! Sparse node ids (nodes `0` and `2` online, `1` offline) are rejected with an error saying so,
//! as in every reader. Offline nodes have no directory, so they do not count.
#![deny(unsafe_code)]

use std::path::{Path, PathBuf};

use numaframe::{MAX_NODES, NodeId, TopologyError};

use super::read_text;
use crate::spec::{
    CpuOwners, MachineSpec, NodeSpec, SpecError, parse_cpulist, parse_decimal, shorten,
};

/// Where Linux puts the node directory.
pub const DEFAULT_SYSFS_DIR: &str = "/sys/devices/system/node";

/// Reads the node directory `dir` (usually [`DEFAULT_SYSFS_DIR`]). The machine is named
/// `sysfs:DIR`.
///
/// # Errors
/// A [`SpecError`] naming the file at fault: `dir` cannot be listed, has no `nodeN`
/// directories or sparse ones, a required file is missing or malformed, the node lists
/// contradict the node files, or the core rejects the topology.
pub fn read_sysfs(dir: &Path) -> Result<MachineSpec, SpecError> {
    let n = node_count(dir)?;
    let has_cpu = node_list(dir, "has_cpu", n)?;
    let has_memory = node_list(dir, "has_memory", n)?;

    let mut nodes = Vec::with_capacity(n);
    let mut distances = Vec::with_capacity(n * n);
    let mut owners = CpuOwners::default();
    for id in 0..n {
        let node_dir = dir.join(format!("node{id}"));
        distances.extend(distance_row(&node_dir.join("distance"), n)?);

        let path = node_dir.join("cpulist");
        let text = read_text(&path)?;
        let mut cpus = parse_cpulist(&text)
            .map_err(|e| SpecError::cpulist("cpulist", text.trim(), e).in_file(shown(&path)))?;
        if let Some(list) = &has_cpu {
            if !list.contains(&id) {
                cpus.clear();
            } else if cpus.is_empty() {
                return Err(SpecError::invalid(format!(
                    "has_cpu lists node {id} but its cpulist is empty"
                ))
                .in_file(shown(&path)));
            }
        }
        owners
            .claim(id, &cpus)
            .map_err(|e| e.in_file(shown(&path)))?;

        let path = node_dir.join("meminfo");
        let mut memory_bytes = mem_total(&path, id)?;
        if let Some(list) = &has_memory {
            if !list.contains(&id) {
                memory_bytes = 0;
            } else if memory_bytes == 0 {
                return Err(SpecError::invalid(format!(
                    "has_memory lists node {id} but its MemTotal is 0"
                ))
                .in_file(shown(&path)));
            }
        }

        let socket = match cpus.first() {
            Some(cpu) => {
                package_id(&node_dir.join(format!("cpu{cpu}/topology/physical_package_id")))?
            }
            None => None,
        };
        nodes.push(NodeSpec {
            cpus,
            memory_bytes,
            socket,
            initiator: None,
            bandwidth_gbps: None,
        });
    }

    // HMAT: initiators of CPU-less nodes (needs every node's CPUs, hence a second pass) and
    // bandwidth.
    for id in 0..n {
        let initiators = dir.join(format!("node{id}/access0/initiators"));
        if nodes[id].cpus.is_empty() {
            let initiator = lowest_cpu_initiator(&initiators, &nodes)?;
            if let Some(init) = initiator {
                nodes[id].initiator = NodeId::try_new(init);
                nodes[id].socket = nodes[init].socket;
            }
        }
        nodes[id].bandwidth_gbps = bandwidth_gbps(&initiators)?;
    }

    MachineSpec::new(format!("sysfs:{}", dir.display()), nodes, distances, None)
        .map_err(|e| e.in_file(shown(dir)))
}

fn shown(path: &Path) -> String {
    path.display().to_string()
}

/// The number of `nodeN` directories, which must be `node0..node{n-1}`.
fn node_count(dir: &Path) -> Result<usize, SpecError> {
    let entries = std::fs::read_dir(dir).map_err(|e| SpecError::io(dir, &e))?;
    let mut ids = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| SpecError::io(dir, &e))?;
        let name = entry.file_name();
        let Some(id) = name
            .to_str()
            .and_then(|s| s.strip_prefix("node"))
            .and_then(parse_decimal)
        else {
            continue;
        };
        // Skip `node01`-style names Linux never makes, and plain files.
        if name.to_str() != Some(&format!("node{id}")) || !entry.path().is_dir() {
            continue;
        }
        ids.push(id);
        if ids.len() > MAX_NODES {
            return Err(
                SpecError::from(TopologyError::TooManyNodes { nodes: ids.len() })
                    .in_file(shown(dir)),
            );
        }
    }
    ids.sort_unstable();
    if ids.is_empty() {
        return Err(SpecError::invalid(
            "no nodeN directories (is this a node directory like /sys/devices/system/node?)",
        )
        .in_file(shown(dir)));
    }
    if ids.iter().enumerate().any(|(i, &id)| id != i as u64) {
        let list: Vec<String> = ids.iter().take(16).map(u64::to_string).collect();
        let more = if ids.len() > 16 { ",…" } else { "" };
        let msg = format!(
            "node ids {}{more} are not 0..{}: numaframe needs consecutive node ids",
            list.join(","),
            ids.len() - 1
        );
        return Err(SpecError::invalid(msg).in_file(shown(dir)));
    }
    Ok(ids.len())
}

/// A file's text, or `None` if it does not exist.
fn read_optional(path: &Path) -> Result<Option<String>, SpecError> {
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        _ => read_text(path).map(Some),
    }
}

/// `has_cpu` / `has_memory`: a node list whose nodes must exist.
fn node_list(dir: &Path, file: &str, n: usize) -> Result<Option<Vec<usize>>, SpecError> {
    let path = dir.join(file);
    let Some(text) = read_optional(&path)? else {
        return Ok(None);
    };
    let ids = parse_cpulist(&text)
        .map_err(|e| SpecError::cpulist(file, text.trim(), e).in_file(shown(&path)))?;
    if let Some(bad) = ids.iter().find(|&&id| id as usize >= n) {
        return Err(SpecError::invalid(format!(
            "lists node {bad}, but there is no node{bad} directory"
        ))
        .in_file(shown(&path)));
    }
    Ok(Some(ids.into_iter().map(|id| id as usize).collect()))
}

/// `10 21 …`: exactly `n` distances.
fn distance_row(path: &Path, n: usize) -> Result<Vec<u8>, SpecError> {
    let text = read_text(path)?;
    let row: Vec<u8> = text
        .split_whitespace()
        .enumerate()
        .map(|(i, v)| {
            parse_decimal(v)
                .and_then(|d| u8::try_from(d).ok())
                .ok_or_else(|| {
                    SpecError::syntax(format!(
                        "entry {i} is {:?}, not a distance 0..=255",
                        shorten(v)
                    ))
                    .in_file(shown(path))
                })
        })
        .collect::<Result<_, _>>()?;
    if row.len() != n {
        return Err(SpecError::invalid(format!(
            "{} distances, expected {n} (one per node)",
            row.len()
        ))
        .in_file(shown(path)));
    }
    Ok(row)
}

/// `Node N MemTotal:  16384000 kB` → bytes.
fn mem_total(path: &Path, id: usize) -> Result<u64, SpecError> {
    let text = read_text(path)?;
    for (index, line) in text.lines().enumerate() {
        let tokens: Vec<&str> = line.split_whitespace().collect();
        if tokens.get(2) != Some(&"MemTotal:") {
            continue;
        }
        let err = |msg: String| {
            SpecError::syntax(msg)
                .in_file(shown(path))
                .at_line(index + 1)
        };
        let ["Node", node, "MemTotal:", kb, "kB"] = tokens[..] else {
            return Err(err(format!(
                "expected `Node {id} MemTotal: <n> kB`, found {:?}",
                shorten(line.trim())
            )));
        };
        if parse_decimal(node) != Some(id as u64) {
            return Err(err(format!(
                "MemTotal line is for node {:?}, expected node {id}",
                shorten(node)
            )));
        }
        let kb = parse_decimal(kb)
            .ok_or_else(|| err(format!("MemTotal {:?} is not a number", shorten(kb))))?;
        return kb
            .checked_mul(1024)
            .ok_or_else(|| err(format!("MemTotal {kb} kB does not fit in 64 bits")));
    }
    Err(SpecError::syntax(format!("no `Node {id} MemTotal:` line")).in_file(shown(path)))
}

/// A CPU's package id: `None` if the file is missing or says -1 (unknown).
fn package_id(path: &Path) -> Result<Option<u16>, SpecError> {
    let Some(text) = read_optional(path)? else {
        return Ok(None);
    };
    let t = text.trim();
    if t == "-1" {
        return Ok(None);
    }
    match parse_decimal(t) {
        Some(v) => Ok(u16::try_from(v).ok()),
        None => Err(
            SpecError::syntax(format!("expected a package id, found {:?}", shorten(t)))
                .in_file(shown(path)),
        ),
    }
}

/// The lowest `nodeM` entry of an HMAT initiators directory that is a node with CPUs.
fn lowest_cpu_initiator(dir: &Path, nodes: &[NodeSpec]) -> Result<Option<usize>, SpecError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(SpecError::io(dir, &e)),
    };
    let mut best: Option<usize> = None;
    for entry in entries {
        let entry = entry.map_err(|e| SpecError::io(dir, &e))?;
        let name = entry.file_name();
        let Some(m) = name
            .to_str()
            .and_then(|s| s.strip_prefix("node"))
            .and_then(parse_decimal)
        else {
            continue;
        };
        let Ok(m) = usize::try_from(m) else {
            continue;
        };
        if nodes.get(m).is_some_and(|node| !node.cpus.is_empty()) && best.is_none_or(|b| m < b) {
            best = Some(m);
        }
    }
    Ok(best)
}

/// `min(read_bandwidth, write_bandwidth)` of an HMAT initiators directory, MB/s → GB/s
/// (`None` when neither file exists or the bandwidth is below 1 GB/s).
fn bandwidth_gbps(dir: &Path) -> Result<Option<u32>, SpecError> {
    let mut best: Option<u64> = None;
    for file in ["read_bandwidth", "write_bandwidth"] {
        let path: PathBuf = dir.join(file);
        let Some(text) = read_optional(&path)? else {
            continue;
        };
        let mbps = parse_decimal(text.trim()).ok_or_else(|| {
            SpecError::syntax(format!("expected MB/s, found {:?}", shorten(text.trim())))
                .in_file(shown(&path))
        })?;
        best = Some(best.map_or(mbps, |b| b.min(mbps)));
    }
    Ok(best
        .map(|mbps| mbps / 1000)
        .filter(|&g| g > 0)
        .map(|g| u32::try_from(g).unwrap_or(u32::MAX)))
}

#[cfg(test)]
mod tests {
    use std::fs;

    use numaframe_testkit::TempDir;

    use super::*;

    /// The cxl-2socket machine as sysfs shows it, with HMAT.
    fn cxl_tree(tag: &str) -> TempDir {
        let t = TempDir::new(tag);
        let d = ["10 21 14 24", "21 10 24 14", "14 24 10 34", "24 14 34 10"];
        let cpus = ["0-15", "16-31", "", ""];
        let kb = [64u64 << 20, 64 << 20, 32 << 20, 32 << 20];
        let bw = [300_000, 300_000, 100_000, 100_000];
        for i in 0..4 {
            t.put(&format!("node{i}/distance"), &format!("{}\n", d[i]));
            t.put(&format!("node{i}/cpulist"), &format!("{}\n", cpus[i]));
            t.put(
                &format!("node{i}/meminfo"),
                &format!(
                    "Node {i} MemTotal:       {} kB\nNode {i} MemFree:  1 kB\n",
                    kb[i]
                ),
            );
            t.put(
                &format!("node{i}/access0/initiators/read_bandwidth"),
                &format!("{}\n", bw[i]),
            );
            t.put(
                &format!("node{i}/access0/initiators/write_bandwidth"),
                &format!("{}\n", bw[i] + 5),
            );
            t.put(
                &format!("node{i}/access0/initiators/node{}/.keep", i % 2),
                "",
            );
        }
        t.put("node0/cpu0/topology/physical_package_id", "0\n");
        t.put("node1/cpu16/topology/physical_package_id", "1\n");
        t.put("has_cpu", "0-1\n");
        t.put("has_memory", "0-3\n");
        t.put("online", "0-3\n");
        t
    }

    #[test]
    fn reads_fake_cxl_tree() {
        let t = cxl_tree("ok");
        let s = read_sysfs(t.path()).unwrap();
        // sysfs knows no socket link bandwidth; everything else matches the preset.
        let cxl = crate::presets::preset("cxl-2socket").unwrap();
        let want = MachineSpec::new(
            s.name(),
            cxl.nodes().to_vec(),
            cxl.distances().to_vec(),
            None,
        )
        .unwrap();
        assert_eq!(s, want);
    }

    #[test]
    fn node_lists_decide_states() {
        let t = cxl_tree("lists");
        t.put("has_cpu", "0\n");
        t.put("has_memory", "0-2\n");
        t.remove("node1/access0");
        t.remove("node3/access0");
        let s = read_sysfs(t.path()).unwrap();
        assert!(s.nodes()[1].cpus.is_empty());
        assert_eq!(s.nodes()[3].memory_bytes, 0);
        t.remove("has_cpu");
        t.remove("has_memory");
        assert_eq!(read_sysfs(t.path()).unwrap().nodes()[1].cpus.len(), 16);
    }

    #[test]
    fn malformed_trees() {
        type Edit = fn(&TempDir);
        let cases: &[(&str, Edit, &str)] = &[
            (
                "sparse",
                |t| fs::rename(t.path().join("node3"), t.path().join("node5")).unwrap(),
                "node ids 0,1,2,5 are not 0..3",
            ),
            (
                "no-distance",
                |t| t.remove("node2/distance"),
                "node2/distance: ",
            ),
            (
                "short-row",
                |t| _ = t.put("node2/distance", "10 20\n"),
                "node2/distance: 2 distances, expected 4 (one per node)",
            ),
            (
                "bad-row",
                |t| _ = t.put("node2/distance", "14 24 10 x\n"),
                "node2/distance: entry 3 is \"x\"",
            ),
            (
                "big-row",
                |t| _ = t.put("node2/distance", "14 24 10 256\n"),
                "entry 3 is \"256\"",
            ),
            (
                "bad-cpulist",
                |t| _ = t.put("node0/cpulist", "0-\n"),
                "node0/cpulist: cpulist: bad list \"0-\"",
            ),
            (
                "no-cpulist",
                |t| t.remove("node0/cpulist"),
                "node0/cpulist: ",
            ),
            (
                "no-memtotal",
                |t| _ = t.put("node1/meminfo", "Node 1 MemFree: 5 kB\n"),
                "node1/meminfo: no `Node 1 MemTotal:` line",
            ),
            (
                "memtotal-node",
                |t| _ = t.put("node1/meminfo", "Node 0 MemTotal: 5 kB\n"),
                "node1/meminfo:1: MemTotal line is for node \"0\"",
            ),
            (
                "memtotal-unit",
                |t| _ = t.put("node1/meminfo", "Node 1 MemTotal: 5 MB\n"),
                "node1/meminfo:1: expected `Node 1 MemTotal: <n> kB`",
            ),
            (
                "memtotal-num",
                |t| _ = t.put("node1/meminfo", "Node 1 MemTotal: x kB\n"),
                "MemTotal \"x\" is not a number",
            ),
            (
                "memtotal-big",
                |t| {
                    t.put(
                        "node1/meminfo",
                        "Node 1 MemTotal: 99999999999999999999 kB\n",
                    );
                },
                "not a number",
            ),
            (
                "memtotal-ovf",
                |t| {
                    t.put(
                        "node1/meminfo",
                        "Node 1 MemTotal: 18446744073709551615 kB\n",
                    );
                },
                "does not fit in 64 bits",
            ),
            (
                "has-cpu-bad",
                |t| _ = t.put("has_cpu", "0-1-2\n"),
                "has_cpu: has_cpu: bad list",
            ),
            (
                "has-cpu-range",
                |t| _ = t.put("has_cpu", "0-9\n"),
                "has_cpu: lists node 4, but there is no node4 directory",
            ),
            (
                "has-cpu-empty",
                |t| _ = t.put("has_cpu", "0-2\n"),
                "has_cpu lists node 2 but its cpulist is empty",
            ),
            (
                "has-mem-zero",
                |t| _ = t.put("node3/meminfo", "Node 3 MemTotal: 0 kB\n"),
                "has_memory lists node 3 but its MemTotal is 0",
            ),
            (
                "package",
                |t| _ = t.put("node0/cpu0/topology/physical_package_id", "zero\n"),
                "expected a package id",
            ),
            (
                "bandwidth",
                |t| _ = t.put("node0/access0/initiators/read_bandwidth", "fast\n"),
                "read_bandwidth: expected MB/s",
            ),
            (
                "dup-cpu",
                |t| _ = t.put("node1/cpulist", "15-31\n"),
                "CPU 15 is in node 0 and in node 1",
            ),
            (
                "diagonal",
                |t| _ = t.put("node1/distance", "21 11 24 14\n"),
                "invalid topology: distance 1->1 is 11",
            ),
            (
                "empty",
                |t| (0..4).for_each(|i| t.remove(&format!("node{i}"))),
                "no nodeN directories",
            ),
        ];
        for (tag, edit, want) in cases {
            let t = cxl_tree(tag);
            edit(&t);
            let got = read_sysfs(t.path())
                .map(|s| format!("accepted {s:?}"))
                .unwrap_or_else(|e| e.to_string());
            assert!(got.contains(want), "{tag}: got {got:?}, want {want:?}");
            assert!(!got.contains('\n'), "{tag}: {got:?}");
        }
    }

    #[test]
    fn missing_dir_is_an_io_error() {
        let e = read_sysfs(Path::new("/nonexistent/numaframe/node")).unwrap_err();
        assert!(
            e.to_string().starts_with("/nonexistent/numaframe/node: "),
            "{e}"
        );
    }

    #[test]
    fn ignores_other_entries() {
        let t = cxl_tree("other");
        t.put("node01/distance", "10\n");
        t.put("nodefoo", "");
        t.put("node7", "not a directory");
        assert_eq!(read_sysfs(t.path()).unwrap().len(), 4);
    }

    #[test]
    fn this_machine() {
        let dir = Path::new(DEFAULT_SYSFS_DIR);
        if dir.is_dir() {
            let s = read_sysfs(dir).unwrap();
            assert!(!s.is_empty());
            assert!(s.nodes().iter().any(|n| n.memory_bytes > 0));
        }
    }
}
