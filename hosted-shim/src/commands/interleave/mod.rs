//! `numaframe interleave`: one task's successive weighted-interleave bulk allocations on a
//! simulated machine, and (`--model`, in `model.rs`) the placement model of [`crate::model`].
//!
//! The contract is docs' ("Hosted CLI contract"); the choices it leaves open are made
//! here and printed by `numaframe help interleave`:
//! - `--weights` takes one weight per node of the machine (by node id) or one per node of
//!   `--nodes` (ascending); the count decides which. `auto` derives them from the topology's
//!   bandwidths over the policy's nodes.
//! - "A machine with enough memory": every node of the policy gets at least room for the
//!   largest call on top of its metadata and watermarks ([`with_room`]); nodes that already
//!   have that keep the topology's size. So every page lands on the node the plan chose, and a
//!   run checks that it did (numastat: every page an interleave hit, no miss).
//! - Frames are freed after each call; the interleave state carries over to the next call.
#![deny(unsafe_code)]

mod model;

use std::io::Write;

use numaframe::interleave::{IlState, Weights};
use numaframe::policy::{Policy, TaskPolicy, auto_weights};
use numaframe::{AllocFlags, BootOptions, Machine, NodeId, NodeMask, PAGE_SIZE, Pfn};
use serde::Serialize;
use serde::ser::Serializer;

use super::source::Source;
use crate::error::CliError;
use crate::sim::Sim;
use crate::spec::{MachineSpec, parse_cpulist, parse_decimal, shorten};

/// The most pages one call may ask for: 2^26 (256 GiB of 4 KiB pages; the frame list alone is
/// 512 MiB).
pub const MAX_PAGES_PER_CALL: u64 = 1 << 26;
/// The most calls one run may make.
pub const MAX_CALLS: usize = 4096;
/// The most simulated memory a run may map (address space, not RAM: the arenas are
/// `MAP_NORESERVE` and only metadata is touched).
pub const MAX_SIM_BYTES: u64 = 64 << 40;
/// Pages per CPU node the model's placements are measured with (rounded up to a whole number
/// of interleave rounds).
pub const MODEL_SAMPLE_PAGES: u64 = 1 << 16;

/// What `numaframe help interleave` prints before the options.
const ABOUT: &str = "\
One task's weighted-interleave bulk allocations: pages per node, node calls, state; or the placement model.

One task (a TaskPolicy with WeightedInterleave over --nodes) makes one bulk allocation per --pages entry, in order, on a simulated machine of the topology. Each call prints the pages per policy node (zeros included), the node bulk calls it made (node_calls) and the normalised state (node that serves the next page, pages it still has this turn). Frames are freed after each call; the interleave state carries over.";

/// What `numaframe help interleave` prints after the options.
const AFTER: &str = "\
--json: {\"calls\":[{\"pages\":N,\"counts\":{\"0\":n0,...},\"node_calls\":k,\"state\":{\"node\":a,\"left\":b}},...]}

Memory: a node of --nodes that is too small to hold the largest call (plus its metadata and watermarks) is simulated with enough memory for it; the fallback order does not change, and every page lands on the node the interleave chose (checked after each call).";

/// The options of `numaframe interleave`.
#[derive(clap::Args, Clone, Debug, Default)]
#[command(
    override_usage = "numaframe interleave <topology> --weights W,W,...|auto [--nodes LIST] [--state NODE:LEFT] [--cpu-node N] [--socket-aware] --pages N[,N...] [--json] [--model]",
    long_about = ABOUT,
    after_long_help = AFTER
)]
pub struct Args {
    /// Weights 1..=255: one per node of the machine (by node id), or one per node of --nodes
    /// (ascending); `auto` derives them from the topology's bandwidth_gbps over --nodes (every
    /// node needs one)
    #[arg(long, value_name = "W,W,...|auto")]
    pub weights: Option<String>,
    /// The policy's nodes, a cpulist such as 0-1,3 (default: every node with memory); each must
    /// exist and have memory
    #[arg(long, value_name = "LIST")]
    pub nodes: Option<String>,
    /// The task's raw starting state (prev, left), e.g. 0:7 (default: a fresh task, the first
    /// page goes to the lowest node)
    #[arg(long, value_name = "NODE:LEFT")]
    pub state: Option<String>,
    /// The node of the allocating CPU (default: the first node with CPUs)
    #[arg(long, value_name = "N")]
    pub cpu_node: Option<String>,
    /// Restrict to the CPU node's package first (docs' socket-aware interleave)
    #[arg(long)]
    pub socket_aware: bool,
    /// The size of each call, at most 67108864 pages, at most 4096 calls
    #[arg(long, value_name = "N[,N...]")]
    pub pages: Option<String>,
    /// Instead of the calls: the placement model (local DRAM only, flat and socket-aware
    /// weighted interleave) over every CPU node, next to the seed's measurements on
    /// cxl-2socket; takes --weights (default auto) and --nodes only. Resources: each node's
    /// bandwidth_gbps and the socket_link_gbps links, full duplex (each direction between two
    /// packages is its own resource); the shared-link figure is printed too
    #[arg(long)]
    pub model: bool,
    /// The machine.
    #[command(flatten, next_help_heading = "Topology (exactly one)")]
    pub source: Source,
}

/// Runs `numaframe interleave`.
///
/// # Errors
/// As [`run`]; [`CliError::BadInput`] also for a bad topology.
pub fn command(args: &Args, json: bool, out: &mut dyn Write) -> Result<(), CliError> {
    let spec = args.source.machine()?;
    run(&spec, args, json, out)
}

pub(super) fn bad(message: String) -> CliError {
    CliError::BadInput(message)
}

pub(super) fn internal(message: String) -> CliError {
    CliError::Internal(message)
}

/// Runs `numaframe interleave` on `spec`.
///
/// # Errors
/// [`CliError::BadInput`] for bad options (exit 2), [`CliError::Internal`] if the simulated
/// machine cannot be built or the allocator misbehaves (exit 1).
pub fn run(
    spec: &MachineSpec,
    args: &Args,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    if args.model {
        return model::run_model(spec, args, json, out);
    }
    let mask = parse_nodes(spec, args.nodes.as_deref())?;
    let weights = parse_weights(
        spec,
        &mask,
        args.weights
            .as_deref()
            .ok_or_else(|| bad("--weights is required (W,W,... or auto)".to_string()))?,
    )?;
    let state = args
        .state
        .as_deref()
        .map(|s| parse_state(spec, s))
        .transpose()?
        .unwrap_or_default();
    let cpu_node = match args.cpu_node.as_deref() {
        Some(text) => parse_node(spec, "--cpu-node", text)?,
        None => default_cpu_node(spec),
    };
    let pages = parse_pages(
        args.pages
            .as_deref()
            .ok_or_else(|| bad("--pages is required (N[,N...])".to_string()))?,
    )?;
    let setup = Setup {
        mask,
        weights,
        state,
        cpu_node,
        socket_aware: args.socket_aware,
    };
    let run = run_calls(spec, &setup, &pages)?;
    if json {
        write_json(&run.calls, out)
    } else {
        write_text(spec, &setup, &run.enlarged, &run.calls, out)
    }
}

/// What one run allocates with.
#[derive(Clone, Debug)]
pub struct Setup {
    /// The policy's nodes.
    pub mask: NodeMask,
    /// The machine's weight table.
    pub weights: Weights,
    /// The task's starting state.
    pub state: IlState,
    /// The node of the allocating CPU.
    pub cpu_node: NodeId,
    /// Socket-aware mode.
    pub socket_aware: bool,
}

/// What one call did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    /// Pages asked for (and placed).
    pub pages: u64,
    /// Pages per policy node, ascending, zeros included.
    pub counts: Vec<(NodeId, u64)>,
    /// Node bulk calls made.
    pub node_calls: usize,
    /// The normalised state afterwards: (node that serves the next page, pages it still has).
    pub state: (NodeId, u8),
}

/// The first node with CPUs, or node 0 if none has any.
fn default_cpu_node(spec: &MachineSpec) -> NodeId {
    spec.topology()
        .cpu_nodes()
        .first()
        .unwrap_or(NodeId::new(0))
}

/// A node id of the machine.
fn parse_node(spec: &MachineSpec, option: &str, text: &str) -> Result<NodeId, CliError> {
    let t = text.trim();
    let n = parse_decimal(t).ok_or_else(|| {
        bad(format!(
            "{option}: `{}` is not a node number",
            shorten(text)
        ))
    })?;
    match usize::try_from(n) {
        Ok(i) if i < spec.len() => Ok(NodeId::new(i)),
        _ => Err(bad(format!(
            "{option}: node {n} is not in the machine (it has nodes 0-{})",
            spec.len() - 1
        ))),
    }
}

/// `--nodes`: a cpulist of nodes that exist and have memory; default every node with memory.
pub(super) fn parse_nodes(spec: &MachineSpec, text: Option<&str>) -> Result<NodeMask, CliError> {
    let Some(text) = text else {
        let mask = spec.topology().memory_nodes();
        if mask.is_empty() {
            return Err(bad("no node of the machine has memory".to_string()));
        }
        return Ok(mask);
    };
    let list = parse_cpulist(text)
        .map_err(|e| bad(format!("--nodes: bad list `{}`: {e}", shorten(text))))?;
    if list.is_empty() {
        return Err(bad(
            "--nodes: the list is empty (the policy needs at least one node)".to_string(),
        ));
    }
    let mut mask = NodeMask::EMPTY;
    for n in list {
        let i = n as usize;
        if i >= spec.len() {
            return Err(bad(format!(
                "--nodes: node {n} is not in the machine (it has nodes 0-{})",
                spec.len() - 1
            )));
        }
        if spec.nodes()[i].memory_bytes == 0 {
            return Err(bad(format!("--nodes: node {n} has no memory")));
        }
        mask.insert(NodeId::new(i));
    }
    Ok(mask)
}

/// `--weights`: `auto`, or one weight 1..=255 per machine node or per policy node.
pub(super) fn parse_weights(
    spec: &MachineSpec,
    mask: &NodeMask,
    text: &str,
) -> Result<Weights, CliError> {
    if text.trim() == "auto" {
        return auto_weights(&spec.topology(), mask)
            .map_err(|e| bad(format!("--weights auto: {e}")));
    }
    let items: Vec<&str> = text.split(',').map(str::trim).collect();
    let targets: Vec<NodeId> = if items.len() == spec.len() {
        (0..spec.len()).map(NodeId::new).collect()
    } else if items.len() == mask.count() {
        mask.iter().collect()
    } else {
        return Err(bad(format!(
            "--weights: {} weights given; give one per node of the machine ({}) or one per node of the policy ({})",
            items.len(),
            spec.len(),
            mask.count()
        )));
    };
    let mut table = vec![1u8; spec.len()];
    for (item, node) in items.iter().zip(targets) {
        if item.is_empty() {
            return Err(bad(format!(
                "--weights: the weight of node {node} is empty"
            )));
        }
        let w = parse_decimal(item).ok_or_else(|| {
            bad(format!(
                "--weights: `{}` (node {node}) is not a number; weights are 1..=255",
                shorten(item)
            ))
        })?;
        if w == 0 || w > 255 {
            return Err(bad(format!(
                "--weights: the weight of node {node} is {w}; weights are 1..=255"
            )));
        }
        table[node.index()] = w as u8;
    }
    Weights::new(&table).map_err(|e| bad(format!("--weights: {e}")))
}

/// `--state NODE:LEFT`.
fn parse_state(spec: &MachineSpec, text: &str) -> Result<IlState, CliError> {
    let Some((node, left)) = text.split_once(':') else {
        return Err(bad(format!(
            "--state: `{}` is not NODE:LEFT (e.g. 0:7)",
            shorten(text)
        )));
    };
    let node = parse_node(spec, "--state", node)?;
    let left = parse_decimal(left.trim())
        .and_then(|l| u8::try_from(l).ok())
        .ok_or_else(|| {
            bad(format!(
                "--state: LEFT `{}` is not a number 0..=255",
                shorten(left)
            ))
        })?;
    Ok(IlState::from_raw(node, left))
}

/// `--pages N[,N...]`.
fn parse_pages(text: &str) -> Result<Vec<u64>, CliError> {
    let items: Vec<&str> = text.split(',').map(str::trim).collect();
    if items.len() > MAX_CALLS {
        return Err(bad(format!(
            "--pages: {} calls given, at most {MAX_CALLS}",
            items.len()
        )));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, item)| match parse_decimal(item) {
            Some(n) if n <= MAX_PAGES_PER_CALL => Ok(n),
            Some(n) => Err(bad(format!(
                "--pages: call {} asks for {n} pages, at most {MAX_PAGES_PER_CALL}",
                i + 1
            ))),
            None => Err(bad(format!(
                "--pages: `{}` (call {}) is not a number of pages",
                shorten(item),
                i + 1
            ))),
        })
        .collect()
}

/// Bytes a node needs to hand out `pages` pages on a machine of at most `machine_bytes`: the
/// pages, their metadata (16 bytes a frame, 1/256) and the low watermark (5/4 of the node's
/// share of Linux's default `min_free_kbytes = sqrt(16 · KiB)`, at most 256 MiB, plus 1/1000
/// of the zone), with room to spare: `pages · 4 KiB · (1 + 1/64) + 2 · min_free + 8 MiB`.
fn bytes_for(pages: u64, machine_bytes: u64) -> u64 {
    let bytes = pages * PAGE_SIZE;
    let min_free = ((machine_bytes / 1024).saturating_mul(16))
        .isqrt()
        .clamp(128, 262_144)
        * 1024;
    (bytes + bytes / 64 + 2 * min_free + (8 << 20)).next_multiple_of(PAGE_SIZE)
}

/// `spec` with every node of `nodes` able to hand out `pages` pages: a node smaller than that
/// is enlarged, everything else (distances, CPUs, sockets, bandwidths) is kept. Returns the new
/// spec and the nodes it enlarged with their new size in bytes.
///
/// # Errors
/// [`CliError::BadInput`] if the machine would exceed [`MAX_SIM_BYTES`].
pub fn with_room(
    spec: &MachineSpec,
    nodes: &NodeMask,
    pages: u64,
) -> Result<(MachineSpec, Vec<(NodeId, u64)>), CliError> {
    let too_big = || {
        bad(format!(
            "{pages} pages on each of {} nodes needs more than {} TiB of simulated memory",
            nodes.count(),
            MAX_SIM_BYTES >> 40
        ))
    };
    // An upper bound of the enlarged machine's size, for the watermark estimate.
    let bound = (nodes.count() as u64)
        .checked_mul(bytes_for(pages, MAX_SIM_BYTES))
        .and_then(|b| b.checked_add(spec.total_memory_bytes()))
        .ok_or_else(too_big)?;
    // A memoryless node keeps its tables and its CPUs' in a node with memory (Linux's
    // `numa_mem_id`), which may be one of `nodes`: each has room for all of them, and for its
    // own.
    let tables = |cpus: usize| Machine::table_bytes(spec.len(), cpus);
    let hosted = spec
        .nodes()
        .iter()
        .filter(|n| n.memory_bytes == 0)
        .fold(0u64, |sum, n| sum.saturating_add(tables(n.cpus.len())));
    let base = bytes_for(pages, bound).saturating_add(hosted);
    let mut specs = spec.nodes().to_vec();
    let mut enlarged = Vec::new();
    for n in nodes {
        if let Some(node) = specs.get_mut(n.index()) {
            let need = base.saturating_add(tables(node.cpus.len()));
            if node.memory_bytes > 0 && node.memory_bytes < need {
                node.memory_bytes = need;
                enlarged.push((n, need));
            }
        }
    }
    let total = specs
        .iter()
        .try_fold(0u64, |t, n| t.checked_add(n.memory_bytes))
        .filter(|t| *t <= MAX_SIM_BYTES);
    if total.is_none() {
        return Err(too_big());
    }
    if enlarged.is_empty() {
        return Ok((spec.clone(), enlarged));
    }
    let roomy = MachineSpec::new(
        spec.name(),
        specs,
        spec.distances().to_vec(),
        spec.socket_link_gbps(),
    )
    .map_err(|e| internal(format!("enlarging the machine: {e}")))?;
    Ok((roomy, enlarged))
}

/// Sums of numastat counters over all nodes: (interleave_hit, numa_miss).
fn il_stats(machine: &Machine<'_>) -> (u64, u64) {
    machine
        .topology()
        .node_ids()
        .filter_map(|n| machine.numastat(n))
        .fold((0, 0), |(h, m), s| (h + s.interleave_hit, m + s.numa_miss))
}

/// What [`run_calls`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Run {
    /// Each call's report, in order.
    pub calls: Vec<Call>,
    /// The nodes simulated with more memory than the topology gives, with their size in bytes.
    pub enlarged: Vec<(NodeId, u64)>,
}

/// Runs the calls of `pages` on a simulated `spec` (enlarged as [`with_room`] says) with one
/// task.
///
/// # Errors
/// [`CliError::BadInput`] if the policy does not fit the machine or the machine would be too
/// large, [`CliError::Internal`] if it cannot be simulated or a page does not land where the
/// plan put it.
pub fn run_calls(spec: &MachineSpec, setup: &Setup, pages: &[u64]) -> Result<Run, CliError> {
    let largest = pages.iter().copied().max().unwrap_or(0);
    let (roomy, enlarged) = with_room(spec, &setup.mask, largest)?;
    let sim = Sim::new(&roomy).map_err(|e| internal(format!("simulating the machine: {e}")))?;
    let machine = sim
        .boot(BootOptions::default())
        .map_err(|e| internal(format!("boot: {e}")))?;
    machine.set_weights(setup.weights.clone());
    let mut task = TaskPolicy::new(
        &machine,
        Policy::WeightedInterleave(setup.mask),
        setup.socket_aware,
    )
    .map_err(|e| bad(format!("policy: {e}")))?;
    task.set_il_state(setup.state);

    // `largest <= MAX_PAGES_PER_CALL`, so it fits a usize.
    let mut frames = vec![Pfn::new(0); largest as usize];
    let mut per_node = vec![0u64; machine.topology().len()];
    let mut calls = Vec::with_capacity(pages.len());
    for (i, &n) in pages.iter().enumerate() {
        let out = &mut frames[..n as usize];
        let (hit0, miss0) = il_stats(&machine);
        let r = task.alloc_bulk(&machine, setup.cpu_node, AllocFlags::empty(), out);
        let (hit1, miss1) = il_stats(&machine);
        let placed = &out[..r.placed];
        per_node.fill(0);
        let mut foreign = 0u64;
        for &pfn in placed {
            match machine.node_of(pfn) {
                Some(node) => per_node[node.index()] += 1,
                None => foreign += 1,
            }
        }
        machine
            .free_bulk(placed)
            .map_err(|e| internal(format!("call {}: freeing: {e}", i + 1)))?;
        if r.placed as u64 != n || hit1 - hit0 != n || miss1 != miss0 || foreign != 0 {
            return Err(internal(format!(
                "call {}: {} of {n} pages placed, {} on their planned node: the machine was meant to have room for all",
                i + 1,
                r.placed,
                hit1 - hit0
            )));
        }
        let counts: Vec<(NodeId, u64)> = setup
            .mask
            .iter()
            .map(|node| (node, per_node[node.index()]))
            .collect();
        if counts.iter().map(|(_, c)| c).sum::<u64>() != n {
            return Err(internal(format!(
                "call {}: pages landed outside the policy's nodes",
                i + 1
            )));
        }
        let state = task
            .il_report(&machine, setup.cpu_node)
            .ok_or_else(|| internal("no interleave state to report".to_string()))?;
        calls.push(Call {
            pages: n,
            counts,
            node_calls: r.node_calls,
            state,
        });
    }
    Ok(Run { calls, enlarged })
}

/// A JSON object `{"node": value, …}` in ascending node order (serde_json's own map would sort
/// the keys as strings, putting "10" before "2").
pub(super) struct ByNode<'a, T>(&'a [(NodeId, T)]);

impl<T: Serialize> Serialize for ByNode<'_, T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(n, v)| (n.index().to_string(), v)))
    }
}

/// `serialize_with` form of [`ByNode`].
pub(super) fn by_node<T: Serialize, S: Serializer>(
    v: &[(NodeId, T)],
    s: S,
) -> Result<S::Ok, S::Error> {
    ByNode(v).serialize(s)
}

fn write_json(calls: &[Call], out: &mut dyn Write) -> Result<(), CliError> {
    #[derive(Serialize)]
    struct State {
        node: usize,
        left: u8,
    }
    #[derive(Serialize)]
    struct CallDoc<'a> {
        pages: u64,
        counts: ByNode<'a, u64>,
        node_calls: usize,
        state: State,
    }
    #[derive(Serialize)]
    struct Doc<'a> {
        calls: Vec<CallDoc<'a>>,
    }
    let doc = Doc {
        calls: calls
            .iter()
            .map(|c| CallDoc {
                pages: c.pages,
                counts: ByNode(&c.counts),
                node_calls: c.node_calls,
                state: State {
                    node: c.state.0.index(),
                    left: c.state.1,
                },
            })
            .collect(),
    };
    serde_json::to_writer(&mut *out, &doc)?;
    writeln!(out)?;
    Ok(())
}

/// `0,1,3`.
pub(super) fn node_list(nodes: impl IntoIterator<Item = NodeId>) -> String {
    nodes
        .into_iter()
        .map(|n| n.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

pub(super) fn weight_list(weights: &Weights, mask: &NodeMask) -> String {
    mask.iter()
        .map(|n| format!("{n}:{}", weights.get(n)))
        .collect::<Vec<_>>()
        .join(" ")
}

fn write_text(
    spec: &MachineSpec,
    setup: &Setup,
    enlarged: &[(NodeId, u64)],
    calls: &[Call],
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let start = if setup.state == IlState::new() {
        "fresh".to_string()
    } else {
        format!("prev {} left {}", setup.state.prev(), setup.state.left())
    };
    writeln!(
        out,
        "weighted interleave on {}: nodes {}, weights {}, task on node {}{}, start state {start}",
        spec.name(),
        node_list(&setup.mask),
        weight_list(&setup.weights, &setup.mask),
        setup.cpu_node,
        if setup.socket_aware {
            ", socket-aware"
        } else {
            ""
        },
    )?;
    if let Some(&(_, bytes)) = enlarged.first() {
        let largest = calls.iter().map(|c| c.pages).max().unwrap_or(0);
        writeln!(
            out,
            "memory: node {} simulated with {:.2} GiB each (more than the topology gives) to hold {largest} pages",
            node_list(enlarged.iter().map(|(n, _)| *n)),
            bytes as f64 / f64::from(1u32 << 30)
        )?;
    }
    for (i, c) in calls.iter().enumerate() {
        let counts: Vec<String> = c.counts.iter().map(|(n, k)| format!("{n}:{k}")).collect();
        writeln!(
            out,
            "call {}: {} pages: {}; node_calls {}; state ({},{})",
            i + 1,
            c.pages,
            counts.join(" "),
            c.node_calls,
            c.state.0,
            c.state.1
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::presets::preset;

    fn cxl() -> MachineSpec {
        preset("cxl-2socket").unwrap()
    }

    fn n(i: usize) -> NodeId {
        NodeId::new(i)
    }

    fn err_text<T>(r: Result<T, CliError>) -> String {
        match r {
            Err(CliError::BadInput(m)) => m,
            Err(e) => panic!("expected bad input, got {e:?}"),
            Ok(_) => panic!("expected bad input, got Ok"),
        }
    }

    #[test]
    fn weights_per_machine_node_or_per_policy_node() {
        let spec = cxl();
        let two = NodeMask::from_nodes([n(0), n(1)]);
        let w = parse_weights(&spec, &two, "10,7").unwrap();
        assert_eq!((w.get(n(0)), w.get(n(1))), (10, 7));
        let w = parse_weights(&spec, &NodeMask::from_nodes([n(1), n(3)]), "10,7").unwrap();
        assert_eq!((w.get(n(1)), w.get(n(3))), (10, 7));
        let w = parse_weights(&spec, &two, "3,3,1,2").unwrap();
        assert_eq!(w.get(n(3)), 2);
        let w = parse_weights(&spec, &NodeMask::first_n(4), "auto").unwrap();
        assert_eq!(
            (0..4).map(|i| w.get(n(i))).collect::<Vec<_>>(),
            [3, 3, 1, 1]
        );
        assert!(err_text(parse_weights(&spec, &two, "1,2,3")).contains("3 weights given"));
        assert!(err_text(parse_weights(&spec, &two, "1,0")).contains("node 1 is 0"));
        assert!(err_text(parse_weights(&spec, &two, "1,256")).contains("node 1 is 256"));
        assert!(err_text(parse_weights(&spec, &two, "1,x")).contains("`x`"));
        assert!(err_text(parse_weights(&spec, &two, "1,")).contains("empty"));
        assert!(err_text(parse_weights(&spec, &two, "-1,2")).contains("not a number"));
        let amd = preset("amd-4node").unwrap();
        assert!(
            err_text(parse_weights(&amd, &two, "auto")).contains("no bandwidth"),
            "auto without bandwidth"
        );
    }

    #[test]
    fn nodes_state_pages() {
        let spec = cxl();
        assert_eq!(parse_nodes(&spec, None).unwrap(), NodeMask::first_n(4));
        assert_eq!(
            parse_nodes(&spec, Some("0,2-3")).unwrap(),
            NodeMask::from_nodes([n(0), n(2), n(3)])
        );
        assert!(err_text(parse_nodes(&spec, Some("4"))).contains("node 4 is not in the machine"));
        assert!(err_text(parse_nodes(&spec, Some("65535"))).contains("not in the machine"));
        assert!(err_text(parse_nodes(&spec, Some(" "))).contains("empty"));
        assert!(err_text(parse_nodes(&spec, Some("1-0"))).contains("bad list"));
        assert_eq!(
            parse_state(&spec, "0:7").unwrap(),
            IlState::from_raw(n(0), 7)
        );
        assert!(err_text(parse_state(&spec, "0")).contains("NODE:LEFT"));
        assert!(err_text(parse_state(&spec, "9:1")).contains("node 9"));
        assert!(err_text(parse_state(&spec, "0:256")).contains("0..=255"));
        assert_eq!(parse_pages("14,0, 3").unwrap(), [14, 0, 3]);
        assert!(err_text(parse_pages("1,,2")).contains("call 2"));
        assert!(err_text(parse_pages(&format!("{}", MAX_PAGES_PER_CALL + 1))).contains("at most"));
        assert!(err_text(parse_pages(&vec!["1"; MAX_CALLS + 1].join(","))).contains("calls"));
        assert!(
            err_text(parse_node(&spec, "--cpu-node", "99999999999999999999"))
                .contains("not a node number")
        );
    }

    #[test]
    fn room_is_added_only_where_needed() {
        let spec = preset("fake-64").unwrap();
        let mask = NodeMask::from_nodes([n(0), n(5)]);
        let (roomy, enlarged) = with_room(&spec, &mask, 100_000).unwrap();
        assert_eq!(
            enlarged.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
            [n(0), n(5)]
        );
        assert!(enlarged[0].1 < 500 << 20, "{enlarged:?}");
        assert!(roomy.nodes()[0].memory_bytes >= 100_000 * PAGE_SIZE);
        assert_eq!(roomy.nodes()[1], spec.nodes()[1]);
        assert_eq!(roomy.distances(), spec.distances());
        let (same, none) = with_room(&spec, &mask, 10).unwrap();
        assert!(none.is_empty());
        assert_eq!(same, spec);
        // 300 nodes of 257 GiB each are more than MAX_SIM_BYTES.
        let nodes = 300;
        let big = MachineSpec::new(
            "big",
            vec![
                crate::spec::NodeSpec {
                    memory_bytes: 1 << 30,
                    ..Default::default()
                };
                nodes
            ],
            (0..nodes * nodes)
                .map(|k| if k / nodes == k % nodes { 10 } else { 20 })
                .collect(),
            None,
        )
        .unwrap();
        let all = NodeMask::first_n(nodes);
        assert!(err_text(with_room(&big, &all, MAX_PAGES_PER_CALL)).contains("TiB"));
    }

    #[test]
    fn seed_case_through_run_calls() {
        let spec = preset("1tb-2node").unwrap();
        let setup = Setup {
            mask: NodeMask::first_n(2),
            weights: Weights::new(&[10, 7]).unwrap(),
            state: IlState::from_raw(n(0), 7),
            cpu_node: n(0),
            socket_aware: false,
        };
        let Run { calls, enlarged } = run_calls(&spec, &setup, &[14, 0, 20]).unwrap();
        assert!(enlarged.is_empty());
        assert_eq!(
            calls[0],
            Call {
                pages: 14,
                counts: vec![(n(0), 7), (n(1), 7)],
                node_calls: 2,
                state: (n(0), 10),
            }
        );
        assert_eq!(calls[1].node_calls, 0);
        assert_eq!(calls[1].state, (n(0), 10));
        // 10 on 0, 7 on 1, 3 on 0.
        assert_eq!(calls[2].counts, [(n(0), 13), (n(1), 7)]);
        assert_eq!(calls[2].state, (n(0), 7));
    }
}
