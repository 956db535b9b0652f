//! An owned description of a NUMA machine, validated once at construction.
//!
//! A [`MachineSpec`] is what every topology source (TOML file, `numactl --hardware` text, Linux
//! sysfs, built-in preset) produces and what every command consumes. It owns its tables, and
//! [`MachineSpec::topology`] lends them to the core as a [`Topology`]. Construction runs
//! [`Topology::new`] plus the rules the core cannot see (a CPU in two nodes, a zero bandwidth), so
//! an invalid spec never exists.
//!
//! The module also holds the two small parsers every reader shares: [`parse_cpulist`] (Linux's
//! `0-3,8,10-11` syntax) and [`parse_size`] (`16G`).
#![deny(unsafe_code)]

use std::fmt;

use numaframe::zonelist::{FallbackOptions, FallbackTable, NodeStates, Scratch, build_fallback};
use numaframe::{MAX_NODES, NodeId, NodeInfo, PAGE_SIZE, Topology, TopologyError};

/// The largest CPU number a cpulist may name (64 CPUs for each of [`MAX_NODES`] nodes).
pub const MAX_CPU_ID: u32 = 65535;

/// One node of a [`MachineSpec`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeSpec {
    /// The node's CPU numbers. [`MachineSpec::new`] sorts them and drops repeats.
    pub cpus: Vec<u32>,
    /// Memory of the node in bytes, a whole number of 4 KiB pages; 0 for a memoryless node.
    pub memory_bytes: u64,
    /// The physical package the node sits in, if known.
    pub socket: Option<u16>,
    /// For a CPU-less node, the CPU node that owns it.
    pub initiator: Option<NodeId>,
    /// Memory bandwidth of the node in GB/s (the input to automatic interleave weights).
    pub bandwidth_gbps: Option<u32>,
}

impl NodeSpec {
    /// The node as the core sees it: `has_cpus` is `!cpus.is_empty()`, `has_memory` is
    /// `memory_bytes > 0`.
    pub fn info(&self) -> NodeInfo {
        NodeInfo {
            has_cpus: !self.cpus.is_empty(),
            has_memory: self.memory_bytes > 0,
            socket: self.socket,
            initiator: self.initiator,
            bandwidth_gbps: self.bandwidth_gbps,
        }
    }
}

/// A validated, owned description of a NUMA machine.
///
/// Invariants (established by [`MachineSpec::new`], kept because the fields are private):
/// - `Topology::new(distances, infos)` succeeds, so `1 <= nodes.len() <= MAX_NODES`, the
///   distance table is `n × n` with SLIT rules, and initiators name CPU nodes;
/// - `infos[i] == nodes[i].info()`;
/// - every node's `cpus` is sorted and without repeats, and no CPU is in two nodes;
/// - every `memory_bytes` is a whole number of pages (0 for memoryless), and their sum fits
///   in a `u64`;
/// - no bandwidth (node or socket link) is zero.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MachineSpec {
    name: String,
    nodes: Vec<NodeSpec>,
    distances: Vec<u8>,
    socket_link_gbps: Option<u32>,
    infos: Vec<NodeInfo>,
}

impl MachineSpec {
    /// Validates and builds a spec. `distances` is row-major: row `i` holds the distances from
    /// node `i`, and `nodes[i]` describes node `i`.
    ///
    /// # Errors
    /// [`SpecErrorKind::Topology`] when the core's [`Topology::new`] rejects the tables, and
    /// [`SpecErrorKind::Invalid`] for a CPU in two nodes, memory that is not whole 4 KiB pages,
    /// total memory above `u64::MAX`, or a zero bandwidth.
    pub fn new(
        name: impl Into<String>,
        mut nodes: Vec<NodeSpec>,
        distances: Vec<u8>,
        socket_link_gbps: Option<u32>,
    ) -> Result<Self, SpecError> {
        if nodes.len() > MAX_NODES {
            return Err(TopologyError::TooManyNodes { nodes: nodes.len() }.into());
        }
        let mut owner: Vec<(u32, usize)> = Vec::new();
        let mut total: u64 = 0;
        for (i, node) in nodes.iter_mut().enumerate() {
            node.cpus.sort_unstable();
            node.cpus.dedup();
            owner.extend(node.cpus.iter().map(|&c| (c, i)));
            if node.memory_bytes % PAGE_SIZE != 0 {
                return Err(SpecError::invalid(format!(
                    "node {i} has {} bytes of memory: give a whole number of 4 KiB pages",
                    node.memory_bytes
                )));
            }
            total = total.checked_add(node.memory_bytes).ok_or_else(|| {
                SpecError::invalid(format!("total memory overflows 64 bits at node {i}"))
            })?;
            if node.bandwidth_gbps == Some(0) {
                return Err(SpecError::invalid(format!(
                    "node {i} has bandwidth_gbps 0: give a positive bandwidth or none"
                )));
            }
        }
        owner.sort_unstable();
        if let Some(w) = owner.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(SpecError::invalid(format!(
                "CPU {} is in node {} and in node {}",
                w[0].0, w[0].1, w[1].1
            )));
        }
        if socket_link_gbps == Some(0) {
            return Err(SpecError::invalid(
                "socket_link_gbps is 0: give a positive bandwidth or none".to_string(),
            ));
        }
        let infos: Vec<NodeInfo> = nodes.iter().map(NodeSpec::info).collect();
        Topology::new(&distances, &infos)?;
        Ok(Self {
            name: name.into(),
            nodes,
            distances,
            socket_link_gbps,
            infos,
        })
    }

    /// The machine's name (a preset name, a file name, `sysfs:DIR`).
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Renames the machine (the name is not part of the topology).
    pub fn set_name(&mut self, name: impl Into<String>) {
        self.name = name.into();
    }
    /// The nodes, indexed by node id.
    pub fn nodes(&self) -> &[NodeSpec] {
        &self.nodes
    }
    /// The node `id`, or `None` if the machine has no such node.
    pub fn node(&self, id: NodeId) -> Option<&NodeSpec> {
        self.nodes.get(id.index())
    }
    /// Number of nodes (at least 1).
    pub fn len(&self) -> usize {
        self.nodes.len()
    }
    /// Always `false`: a spec has at least one node.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
    /// The distance table, row-major, row `i` = distances from node `i`.
    pub fn distances(&self) -> &[u8] {
        &self.distances
    }
    /// The distance from `from` to `to`, or `None` if either node does not exist.
    pub fn distance(&self, from: NodeId, to: NodeId) -> Option<u8> {
        let n = self.nodes.len();
        if from.index() < n && to.index() < n {
            Some(self.distances[from.index() * n + to.index()])
        } else {
            None
        }
    }
    /// Bandwidth between sockets in GB/s, if given (an input of the placement model).
    pub fn socket_link_gbps(&self) -> Option<u32> {
        self.socket_link_gbps
    }
    /// Sum of all nodes' memory in bytes (fits in a `u64` by construction).
    pub fn total_memory_bytes(&self) -> u64 {
        self.nodes.iter().map(|n| n.memory_bytes).sum()
    }
    /// The nodes as the core sees them, as an owned copy. See [`MachineSpec::infos`] to borrow.
    pub fn node_infos(&self) -> Vec<NodeInfo> {
        self.infos.clone()
    }
    /// The nodes as the core sees them, borrowed.
    pub fn infos(&self) -> &[NodeInfo] {
        &self.infos
    }
    /// The validated topology over this spec's tables.
    ///
    /// This re-runs [`Topology::new`] (O(n²)), so keep the result rather than calling it in a
    /// loop.
    ///
    /// # Panics
    /// Never: the tables were validated by [`MachineSpec::new`] and cannot change since.
    pub fn topology(&self) -> Topology<'_> {
        match Topology::new(&self.distances, &self.infos) {
            Ok(t) => t,
            Err(e) => unreachable!("MachineSpec invariant broken: {e}"),
        }
    }
    /// The node states a fallback build sees: nodes with memory and nodes with CPUs.
    pub fn node_states(&self) -> NodeStates {
        let topo = self.topology();
        NodeStates {
            memory: topo.memory_nodes(),
            cpus: topo.cpu_nodes(),
        }
    }
    /// Builds the fallback order of every node with the core's
    /// [`build_fallback`] into heap storage and hands the table to `f`.
    pub fn with_fallback<R>(
        &self,
        opts: FallbackOptions,
        f: impl FnOnce(&FallbackTable<'_>) -> R,
    ) -> R {
        let n = self.nodes.len();
        let topo = self.topology();
        let states = NodeStates {
            memory: topo.memory_nodes(),
            cpus: topo.cpu_nodes(),
        };
        let (mut ids, mut lens) = (vec![NodeId::default(); n * n], vec![0u16; n]);
        let (mut load, mut keys) = (vec![0u32; n], vec![0u64; n]);
        let Some(mut table) = FallbackTable::new(n, &mut ids, &mut lens) else {
            unreachable!("storage sized for {n} nodes");
        };
        build_fallback(
            &topo,
            &states,
            opts,
            &mut Scratch {
                load: &mut load,
                keys: &mut keys,
            },
            &mut table,
        );
        f(&table)
    }
    /// The fallback order of every node as owned rows (row `i` = order of node `i`).
    pub fn fallback_orders(&self, opts: FallbackOptions) -> Vec<Vec<NodeId>> {
        self.with_fallback(opts, |t| {
            (0..t.nodes())
                .map(|i| t.order(NodeId::new(i)).to_vec())
                .collect()
        })
    }
}

/// The node each CPU number of a machine being read belongs to, claimed node by node: a reader
/// refuses a CPU named by two nodes as soon as the second names it, so it never holds more than
/// one node's expanded cpulist beyond [`MAX_CPU_ID`] distinct CPUs (a file naming `0-65535` on
/// every node would otherwise expand all of them before [`MachineSpec::new`] refuses it).
#[derive(Debug)]
pub struct CpuOwners {
    owner: Vec<Option<usize>>,
}

impl Default for CpuOwners {
    fn default() -> Self {
        CpuOwners {
            owner: vec![None; MAX_CPU_ID as usize + 1],
        }
    }
}

impl CpuOwners {
    /// Claims `cpus` (from [`parse_cpulist`], so at most [`MAX_CPU_ID`]) for node `node`.
    ///
    /// # Errors
    /// [`SpecErrorKind::Invalid`] with [`MachineSpec::new`]'s words for the first CPU another
    /// node claimed, or for a number above [`MAX_CPU_ID`].
    pub fn claim(&mut self, node: usize, cpus: &[u32]) -> Result<(), SpecError> {
        for &cpu in cpus {
            let slot = usize::try_from(cpu)
                .ok()
                .and_then(|c| self.owner.get_mut(c))
                .ok_or_else(|| {
                    SpecError::invalid(format!("CPU {cpu} is above the largest, {MAX_CPU_ID}"))
                })?;
            match *slot {
                Some(first) if first != node => {
                    return Err(SpecError::invalid(format!(
                        "CPU {cpu} is in node {first} and in node {node}"
                    )));
                }
                _ => *slot = Some(node),
            }
        }
        Ok(())
    }
}

/// Why a cpulist (or a node list in the same syntax) is malformed. Offsets are byte offsets into
/// the text given to [`parse_cpulist`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CpuListError {
    /// Nothing between two commas, or a trailing comma.
    EmptyItem {
        /// Where the empty item starts.
        offset: usize,
    },
    /// Something other than a decimal number where one was expected.
    BadNumber {
        /// Where the bad number starts.
        offset: usize,
    },
    /// A number above [`MAX_CPU_ID`].
    TooLarge {
        /// Where the number starts.
        offset: usize,
    },
    /// A range `a-b` with `b < a`.
    ReversedRange {
        /// The range start.
        start: u32,
        /// The range end.
        end: u32,
    },
}

impl fmt::Display for CpuListError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            CpuListError::EmptyItem { offset } => write!(f, "empty item at byte {offset}"),
            CpuListError::BadNumber { offset } => {
                write!(f, "expected a decimal number at byte {offset}")
            }
            CpuListError::TooLarge { offset } => {
                write!(f, "number at byte {offset} exceeds {MAX_CPU_ID}")
            }
            CpuListError::ReversedRange { start, end } => {
                write!(f, "range {start}-{end} ends before it starts")
            }
        }
    }
}

impl std::error::Error for CpuListError {}

/// Parses a Linux cpulist such as `0-3,8,10-11` into ascending, distinct numbers.
///
/// Surrounding whitespace (a sysfs file's newline) is ignored, and so is whitespace around
/// items; an empty or blank string is the empty list. Overlapping items are merged, as Linux
/// does. The stride form `0-7:2/4` is not supported. Work and memory are bounded by
/// [`MAX_CPU_ID`], whatever the input.
///
/// # Errors
/// A [`CpuListError`] with the byte offset of the first bad item.
pub fn parse_cpulist(text: &str) -> Result<Vec<u32>, CpuListError> {
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    let mut ranges: Vec<(u32, u32)> = Vec::new();
    let mut offset = 0;
    for raw in text.split(',') {
        let lead = raw.len() - raw.trim_start().len();
        let item = raw.trim();
        let at = offset + lead;
        if item.is_empty() {
            return Err(CpuListError::EmptyItem { offset: at });
        }
        let range = match item.split_once('-') {
            Some((a, b)) => {
                let start = parse_cpu_number(a, at)?;
                let end = parse_cpu_number(b, at + a.len() + 1)?;
                if end < start {
                    return Err(CpuListError::ReversedRange { start, end });
                }
                (start, end)
            }
            None => {
                let cpu = parse_cpu_number(item, at)?;
                (cpu, cpu)
            }
        };
        ranges.push(range);
        offset += raw.len() + 1;
    }
    ranges.sort_unstable();
    let mut out: Vec<u32> = Vec::new();
    let mut next = 0u32; // lowest number not yet emitted once `out` is non-empty
    for (start, end) in ranges {
        let from = if out.is_empty() {
            start
        } else {
            start.max(next)
        };
        if from <= end {
            out.extend(from..=end);
            next = end + 1; // end <= MAX_CPU_ID < u32::MAX
        }
    }
    Ok(out)
}

/// A decimal number `0..=MAX_CPU_ID` with no sign and no spaces; `at` is its offset.
fn parse_cpu_number(s: &str, at: usize) -> Result<u32, CpuListError> {
    match parse_decimal(s) {
        Some(v) if v <= u64::from(MAX_CPU_ID) => Ok(v as u32),
        Some(_) => Err(CpuListError::TooLarge { offset: at }),
        None if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) => {
            Err(CpuListError::TooLarge { offset: at })
        }
        None => Err(CpuListError::BadNumber { offset: at }),
    }
}

/// Digits only (no sign, no spaces, not empty), without overflowing a `u64`.
pub(crate) fn parse_decimal(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.bytes().try_fold(0u64, |acc, b| {
        acc.checked_mul(10)?.checked_add(u64::from(b - b'0'))
    })
}

/// Why a memory size is malformed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SizeError {
    /// The text is empty or blank.
    Empty,
    /// The text does not start with a decimal number.
    BadNumber,
    /// What follows the number is not one of `K`, `M`, `G`, `T`.
    BadSuffix,
    /// The size does not fit in 64 bits.
    Overflow,
}

impl fmt::Display for SizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SizeError::Empty => "empty size",
            SizeError::BadNumber => "expected a decimal number",
            SizeError::BadSuffix => "unknown suffix: use bytes or K, M, G, T (powers of 1024)",
            SizeError::Overflow => "size does not fit in 64 bits",
        })
    }
}

impl std::error::Error for SizeError {}

/// Parses a memory size: plain bytes (`"4096"`) or a number with a binary suffix `K`, `M`, `G`
/// or `T` (either case; `"16G"` is 16 GiB). `"0"` is a memoryless node. Surrounding
/// whitespace is ignored.
///
/// # Errors
/// A [`SizeError`]; sizes above `u64::MAX` are [`SizeError::Overflow`], never wrapped.
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let t = text.trim();
    if t.is_empty() {
        return Err(SizeError::Empty);
    }
    let digits = t.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return Err(SizeError::BadNumber);
    }
    let number = parse_decimal(&t[..digits]).ok_or(SizeError::Overflow)?;
    let shift = match &t[digits..] {
        "" => 0,
        "K" | "k" => 10,
        "M" | "m" => 20,
        "G" | "g" => 30,
        "T" | "t" => 40,
        _ => return Err(SizeError::BadSuffix),
    };
    number.checked_mul(1u64 << shift).ok_or(SizeError::Overflow)
}

/// A machine description could not be read or is invalid.
///
/// Its `Display` is one line: `FILE:LINE: what was wrong`, with the file and line left out when
/// they do not apply. Text taken from the input is quoted, escaped and shortened, so it cannot
/// break the line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecError {
    file: Option<String>,
    line: Option<usize>,
    kind: SpecErrorKind,
}

/// What went wrong, see [`SpecError`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SpecErrorKind {
    /// Reading a file or directory failed (the operating system's message).
    Io(String),
    /// The text breaks its format's syntax or schema.
    Syntax(String),
    /// A cpulist or node list is malformed.
    CpuList {
        /// Which field (`node 2 cpus`, `has_cpu`).
        field: String,
        /// The offending text, shortened.
        text: String,
        /// Why.
        error: CpuListError,
    },
    /// A memory size is malformed.
    Size {
        /// Which field (`node 2 memory`).
        field: String,
        /// The offending text, shortened.
        text: String,
        /// Why.
        error: SizeError,
    },
    /// The description is well-formed but describes an impossible machine.
    Invalid(String),
    /// The core's topology validation failed.
    Topology(TopologyError),
}

impl SpecError {
    /// An error of the given kind, without a file or line.
    pub fn new(kind: SpecErrorKind) -> Self {
        Self {
            file: None,
            line: None,
            kind,
        }
    }
    /// A [`SpecErrorKind::Syntax`] error.
    pub fn syntax(message: impl Into<String>) -> Self {
        Self::new(SpecErrorKind::Syntax(message.into()))
    }
    /// A [`SpecErrorKind::Invalid`] error.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(SpecErrorKind::Invalid(message.into()))
    }
    /// A [`SpecErrorKind::CpuList`] error about `field` holding `text`.
    pub fn cpulist(field: impl Into<String>, text: &str, error: CpuListError) -> Self {
        Self::new(SpecErrorKind::CpuList {
            field: field.into(),
            text: shorten(text),
            error,
        })
    }
    /// A [`SpecErrorKind::Size`] error about `field` holding `text`.
    pub fn size(field: impl Into<String>, text: &str, error: SizeError) -> Self {
        Self::new(SpecErrorKind::Size {
            field: field.into(),
            text: shorten(text),
            error,
        })
    }
    /// A [`SpecErrorKind::Io`] error while reading `path`.
    pub fn io(path: &std::path::Path, error: &std::io::Error) -> Self {
        Self {
            file: Some(path.display().to_string()),
            line: None,
            kind: SpecErrorKind::Io(error.to_string()),
        }
    }
    /// Sets the 1-based line the error is about.
    #[must_use]
    pub fn at_line(mut self, line: usize) -> Self {
        self.line = Some(line);
        self
    }
    /// Sets the file the error is about, unless one is already set.
    #[must_use]
    pub fn in_file(mut self, file: impl Into<String>) -> Self {
        if self.file.is_none() {
            self.file = Some(file.into());
        }
        self
    }
    /// What went wrong.
    pub fn kind(&self) -> &SpecErrorKind {
        &self.kind
    }
    /// The file the error is about, if any.
    pub fn file(&self) -> Option<&str> {
        self.file.as_deref()
    }
    /// The 1-based line the error is about, if known.
    pub fn line(&self) -> Option<usize> {
        self.line
    }
}

impl From<TopologyError> for SpecError {
    fn from(e: TopologyError) -> Self {
        Self::new(SpecErrorKind::Topology(e))
    }
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.file, self.line) {
            (Some(file), Some(line)) => write!(f, "{}:{line}: ", one_line(file))?,
            (Some(file), None) => write!(f, "{}: ", one_line(file))?,
            (None, Some(line)) => write!(f, "line {line}: ")?,
            (None, None) => {}
        }
        match &self.kind {
            SpecErrorKind::Io(m) => write!(f, "{}", one_line(m)),
            SpecErrorKind::Syntax(m) | SpecErrorKind::Invalid(m) => write!(f, "{}", one_line(m)),
            SpecErrorKind::CpuList { field, text, error } => {
                write!(f, "{}: bad list {text:?}: {error}", one_line(field))
            }
            SpecErrorKind::Size { field, text, error } => {
                write!(f, "{}: bad size {text:?}: {error}", one_line(field))
            }
            SpecErrorKind::Topology(e) => write!(f, "invalid topology: {e}"),
        }
    }
}

impl std::error::Error for SpecError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            SpecErrorKind::Topology(e) => Some(e),
            SpecErrorKind::CpuList { error, .. } => Some(error),
            SpecErrorKind::Size { error, .. } => Some(error),
            _ => None,
        }
    }
}

/// `s` with line breaks and other control characters replaced by spaces.
fn one_line(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// Input text cut to at most 40 characters (with `…`), for quoting in a message.
pub(crate) fn shorten(s: &str) -> String {
    const MAX: usize = 40;
    match s.char_indices().nth(MAX) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(cpus: &[u32], gib: u64) -> NodeSpec {
        NodeSpec {
            cpus: cpus.to_vec(),
            memory_bytes: gib << 30,
            ..NodeSpec::default()
        }
    }

    #[test]
    fn cpulist_valid() {
        assert_eq!(
            parse_cpulist("0-3,8,10-11").unwrap(),
            [0, 1, 2, 3, 8, 10, 11]
        );
        assert_eq!(parse_cpulist("").unwrap(), Vec::<u32>::new());
        assert_eq!(parse_cpulist(" \n").unwrap(), Vec::<u32>::new());
        assert_eq!(parse_cpulist("0-1\n").unwrap(), [0, 1]);
        assert_eq!(parse_cpulist("5, 1 ,3-3").unwrap(), [1, 3, 5]);
        assert_eq!(
            parse_cpulist("2-6,0-3,5").unwrap(),
            [0, 1, 2, 3, 4, 5, 6],
            "overlaps merge"
        );
        assert_eq!(parse_cpulist("007").unwrap(), [7]);
        assert_eq!(parse_cpulist("65535").unwrap(), [65535]);
        assert_eq!(parse_cpulist("0-65535").unwrap().len(), 65536);
    }

    #[test]
    fn cpulist_malformed() {
        use CpuListError::*;
        let cases: &[(&str, CpuListError)] = &[
            (",", EmptyItem { offset: 0 }),
            ("1,", EmptyItem { offset: 2 }),
            ("1,,2", EmptyItem { offset: 2 }),
            ("a", BadNumber { offset: 0 }),
            ("1-", BadNumber { offset: 2 }),
            ("-1", BadNumber { offset: 0 }),
            ("1-2-3", BadNumber { offset: 2 }),
            ("+1", BadNumber { offset: 0 }),
            ("1 2", BadNumber { offset: 0 }),
            ("0-3:2/4", BadNumber { offset: 2 }),
            ("4-1", ReversedRange { start: 4, end: 1 }),
            ("65536", TooLarge { offset: 0 }),
            ("0-99999999999999999999999", TooLarge { offset: 2 }),
            ("½", BadNumber { offset: 0 }),
        ];
        for (text, want) in cases {
            assert_eq!(parse_cpulist(text), Err(*want), "{text:?}");
        }
    }

    #[test]
    fn cpulist_work_is_bounded() {
        let many = vec!["0-65535"; 10_000].join(",");
        assert_eq!(parse_cpulist(&many).unwrap().len(), 65536);
    }

    #[test]
    fn size_valid() {
        assert_eq!(parse_size("16G"), Ok(16 << 30));
        assert_eq!(parse_size("48M"), Ok(48 << 20));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("6T"), Ok(6 << 40));
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size(" 4096 "), Ok(4096));
        assert_eq!(parse_size("18446744073709551615"), Ok(u64::MAX));
        assert_eq!(parse_size("16777215T"), Ok(16_777_215 << 40));
    }

    #[test]
    fn size_malformed() {
        use SizeError::*;
        for (text, want) in [
            ("", Empty),
            ("  ", Empty),
            ("G", BadNumber),
            ("-1", BadNumber),
            ("1.5G", BadSuffix),
            ("16GB", BadSuffix),
            ("16 G", BadSuffix),
            ("16P", BadSuffix),
            ("16777216T", Overflow),
            ("18446744073709551616", Overflow),
            ("99999999999999999999999G", Overflow),
        ] {
            assert_eq!(parse_size(text), Err(want), "{text:?}");
        }
    }

    #[test]
    fn spec_valid_and_normalised() {
        let nodes = vec![
            node(&[3, 1, 1], 1),
            NodeSpec {
                initiator: Some(NodeId::new(0)),
                ..node(&[], 2)
            },
        ];
        let s = MachineSpec::new("t", nodes, vec![10, 20, 20, 10], Some(100)).unwrap();
        assert_eq!(s.nodes()[0].cpus, [1, 3]);
        assert_eq!(s.len(), 2);
        assert_eq!(s.total_memory_bytes(), 3 << 30);
        assert_eq!(s.distance(NodeId::new(1), NodeId::new(0)), Some(20));
        assert_eq!(s.distance(NodeId::new(2), NodeId::new(0)), None);
        assert_eq!(
            s.node_infos()[1],
            NodeInfo {
                has_cpus: false,
                has_memory: true,
                initiator: Some(NodeId::new(0)),
                ..NodeInfo::default()
            }
        );
        assert_eq!(s.topology().len(), 2);
        assert_eq!(
            s.fallback_orders(FallbackOptions::default()),
            [
                [NodeId::new(0), NodeId::new(1)],
                [NodeId::new(1), NodeId::new(0)]
            ]
        );
    }

    #[test]
    fn spec_invalid() {
        let err = |nodes: Vec<NodeSpec>, d: Vec<u8>, link| {
            MachineSpec::new("t", nodes, d, link).unwrap_err()
        };
        let e = err(
            vec![node(&[0, 1], 1), node(&[1], 1)],
            vec![10, 20, 20, 10],
            None,
        );
        assert_eq!(e.to_string(), "CPU 1 is in node 0 and in node 1");
        let e = err(
            vec![NodeSpec {
                memory_bytes: 100,
                ..node(&[0], 0)
            }],
            vec![10],
            None,
        );
        assert!(matches!(e.kind(), SpecErrorKind::Invalid(_)), "{e}");
        let e = err(
            vec![NodeSpec {
                memory_bytes: (1 << 30) + 512,
                ..node(&[0], 0)
            }],
            vec![10],
            None,
        );
        assert!(e.to_string().contains("whole number of 4 KiB pages"), "{e}");
        let e = err(
            vec![
                NodeSpec {
                    memory_bytes: u64::MAX - 4095,
                    ..node(&[0], 0)
                },
                node(&[1], 1),
            ],
            vec![10, 20, 20, 10],
            None,
        );
        assert!(e.to_string().contains("overflows"), "{e}");
        let e = err(
            vec![NodeSpec {
                bandwidth_gbps: Some(0),
                ..node(&[0], 1)
            }],
            vec![10],
            None,
        );
        assert!(e.to_string().contains("bandwidth_gbps 0"), "{e}");
        assert!(
            err(vec![node(&[0], 1)], vec![10], Some(0))
                .to_string()
                .contains("socket_link_gbps")
        );
        assert_eq!(
            *err(vec![], vec![], None).kind(),
            SpecErrorKind::Topology(TopologyError::NoNodes)
        );
        assert!(matches!(
            err(vec![node(&[0], 1)], vec![10, 10], None).kind(),
            SpecErrorKind::Topology(TopologyError::DistanceTableSize { .. })
        ));
        let init_bad = vec![
            node(&[0], 1),
            NodeSpec {
                initiator: Some(NodeId::new(5)),
                ..node(&[], 1)
            },
        ];
        assert!(matches!(
            err(init_bad, vec![10, 20, 20, 10], None).kind(),
            SpecErrorKind::Topology(TopologyError::BadInitiator { .. })
        ));
        let too_many = vec![NodeSpec::default(); MAX_NODES + 1];
        assert!(matches!(
            err(too_many, vec![], None).kind(),
            SpecErrorKind::Topology(TopologyError::TooManyNodes { .. })
        ));
    }

    #[test]
    fn error_display_is_one_line() {
        let e = SpecError::cpulist(
            "node 0 cpus",
            "0-\n\u{1b}[31mxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
            CpuListError::BadNumber { offset: 2 },
        )
        .at_line(3)
        .in_file("a\nb.toml");
        let s = e.to_string();
        assert!(!s.contains('\n') && !s.contains('\u{1b}'), "{s}");
        assert!(s.starts_with("a b.toml:3: node 0 cpus: bad list "), "{s}");
        assert_eq!(SpecError::syntax("x").at_line(2).to_string(), "line 2: x");
        assert_eq!(
            SpecError::syntax("x").in_file("f").in_file("g").to_string(),
            "f: x"
        );
        assert_eq!(
            SpecError::from(TopologyError::NoNodes).to_string(),
            "invalid topology: topology has no nodes"
        );
    }
}
