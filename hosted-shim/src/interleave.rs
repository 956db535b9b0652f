//! `numaframe interleave`: one task's successive weighted-interleave bulk allocations on a
//! simulated machine, and (`--model`) the placement model of [`crate::model`].
//!
//! The contract is `DESIGN.md`'s ("Hosted CLI contract"); the choices it leaves open are made
//! here and printed by `numaframe help interleave` ([`HELP`]):
//! - `--weights` takes one weight per node of the machine (by node id) or one per node of
//!   `--nodes` (ascending); the count decides which. `auto` derives them from the topology's
//!   bandwidths over the policy's nodes.
//! - "A machine with enough memory": every node of the policy gets at least room for the
//!   largest call on top of its metadata and watermarks ([`with_room`]); nodes that already
//!   have that keep the topology's size. So every page lands on the node the plan chose, and a
//!   run checks that it did (numastat: every page an interleave hit, no miss).
//! - Frames are freed after each call; the interleave state carries over to the next call.
#![deny(unsafe_code)]

use std::io::Write;

use numaframe::interleave::{IlState, Weights};
use numaframe::policy::{Policy, TaskPolicy, auto_weights};
use numaframe::{AllocFlags, BootOptions, Machine, NodeId, NodeMask, PAGE_SIZE, Pfn};
use serde::Serialize;
use serde::ser::Serializer;

use crate::cli::CliError;
use crate::model::{self, LinkModel, Placement, Resources, Scenario, Throughput};
use crate::presets::preset;
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

/// The details `numaframe help interleave` prints after the usage line.
pub const HELP: &str = "\
One task (a TaskPolicy with WeightedInterleave over --nodes) makes one bulk allocation per
--pages entry, in order, on a simulated machine of the topology. Each call prints the pages
per policy node (zeros included), the node bulk calls it made (node_calls) and the normalised
state (node that serves the next page, pages it still has this turn). Frames are freed after
each call; the interleave state carries over.

options:
  --weights W,W,...|auto  weights 1..=255: one per node of the machine (by node id), or one
                          per node of --nodes (ascending); `auto` derives them from the
                          topology's bandwidth_gbps over --nodes (every node needs one)
  --nodes LIST            the policy's nodes, a cpulist such as 0-1,3 (default: every node
                          with memory); each must exist and have memory
  --state NODE:LEFT       the task's raw starting state (prev, left), e.g. 0:7 (default: a
                          fresh task, the first page goes to the lowest node)
  --cpu-node N            the node of the allocating CPU (default: the first node with CPUs)
  --socket-aware          restrict to the CPU node's package first (DESIGN.md)
  --pages N[,N...]        the size of each call, at most 67108864 pages, at most 4096 calls
  --json                  {\"calls\":[{\"pages\":N,\"counts\":{\"0\":n0,...},\"node_calls\":k,
                          \"state\":{\"node\":a,\"left\":b}},...]}
  --model                 instead of the calls: the placement model (local DRAM only, flat and
                          socket-aware weighted interleave) over every CPU node, next to the
                          seed's measurements on cxl-2socket; takes --weights (default auto)
                          and --nodes only. Resources: each node's bandwidth_gbps and the
                          socket_link_gbps links, full duplex (each direction between two
                          packages is its own resource); the shared-link figure is printed too

memory: a node of --nodes that is too small to hold the largest call (plus its metadata and
watermarks) is simulated with enough memory for it; the fallback order does not change, and
every page lands on the node the interleave chose (checked after each call).";

/// The options of `numaframe interleave`, as given on the command line.
#[derive(Clone, Copy, Debug, Default)]
pub struct Args<'a> {
    /// `--weights`.
    pub weights: Option<&'a str>,
    /// `--nodes`.
    pub nodes: Option<&'a str>,
    /// `--state`.
    pub state: Option<&'a str>,
    /// `--cpu-node`.
    pub cpu_node: Option<&'a str>,
    /// `--socket-aware`.
    pub socket_aware: bool,
    /// `--pages`.
    pub pages: Option<&'a str>,
    /// `--json`.
    pub json: bool,
    /// `--model`.
    pub model: bool,
}

fn bad(message: String) -> CliError {
    CliError::BadInput(message)
}

fn internal(message: String) -> CliError {
    CliError::Internal(message)
}

/// Runs `numaframe interleave` on `spec`.
///
/// # Errors
/// [`CliError::BadInput`] for bad options (exit 2), [`CliError::Internal`] if the simulated
/// machine cannot be built or the allocator misbehaves (exit 1).
pub fn run(spec: &MachineSpec, args: &Args<'_>, out: &mut dyn Write) -> Result<(), CliError> {
    if args.model {
        return run_model(spec, args, out);
    }
    let mask = parse_nodes(spec, args.nodes)?;
    let weights = parse_weights(
        spec,
        &mask,
        args.weights
            .ok_or_else(|| bad("--weights is required (W,W,... or auto)".to_string()))?,
    )?;
    let state = args
        .state
        .map(|s| parse_state(spec, s))
        .transpose()?
        .unwrap_or_default();
    let cpu_node = match args.cpu_node {
        Some(text) => parse_node(spec, "--cpu-node", text)?,
        None => default_cpu_node(spec),
    };
    let pages = parse_pages(
        args.pages
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
    if args.json {
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
fn parse_nodes(spec: &MachineSpec, text: Option<&str>) -> Result<NodeMask, CliError> {
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
fn parse_weights(spec: &MachineSpec, mask: &NodeMask, text: &str) -> Result<Weights, CliError> {
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
    let need = bytes_for(pages, bound);
    let mut specs = spec.nodes().to_vec();
    let mut enlarged = Vec::new();
    for n in nodes {
        if let Some(node) = specs.get_mut(n.index())
            && node.memory_bytes > 0
            && node.memory_bytes < need
        {
            node.memory_bytes = need;
            enlarged.push((n, need));
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
struct ByNode<'a, T>(&'a [(NodeId, T)]);

impl<T: Serialize> Serialize for ByNode<'_, T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(n, v)| (n.index().to_string(), v)))
    }
}

/// `serialize_with` form of [`ByNode`].
fn by_node<T: Serialize, S: Serializer>(v: &[(NodeId, T)], s: S) -> Result<S::Ok, S::Error> {
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
fn node_list(nodes: impl IntoIterator<Item = NodeId>) -> String {
    nodes
        .into_iter()
        .map(|n| n.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

fn weight_list(weights: &Weights, mask: &NodeMask) -> String {
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

// ---------------------------------------------------------------------------------------------
// --model

/// One row of the model's table.
#[derive(Clone, Debug)]
struct ModelRow {
    scenario: Scenario,
    placement: Placement,
    modeled: Throughput,
    /// The same placement with one shared link per socket pair.
    shared: Throughput,
    measured: Option<f64>,
    /// What the memory nodes it uses can deliver together, GB/s.
    memory_bound: f64,
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// Pages per CPU node for the model's placements: [`MODEL_SAMPLE_PAGES`] rounded up to a whole
/// number of rounds of every mask a task may interleave over (the whole mask, and the mask
/// within each CPU node's package), so the shares are exact. Falls back to 2^20 pages when the
/// rounds have no common multiple that small.
fn sample_pages(weights: &Weights, mask: &NodeMask, res: &Resources, cpus: &NodeMask) -> u64 {
    let round = |m: &NodeMask| m.iter().map(|n| u64::from(weights.get(n))).sum::<u64>();
    let mut l = round(mask).max(1);
    for cpu in cpus {
        let pkg = res.package(cpu);
        let sub = NodeMask::from_nodes(mask.iter().filter(|n| res.package(*n) == pkg));
        let r = round(&sub);
        if r > 0 {
            l = l / gcd(l, r) * r;
        }
        if l > 1 << 20 {
            return 1 << 20;
        }
    }
    MODEL_SAMPLE_PAGES.div_ceil(l) * l
}

fn model_error(e: model::ModelError) -> CliError {
    match e {
        model::ModelError::NoCpuNodes
        | model::ModelError::NoBandwidth { .. }
        | model::ModelError::NoLinkBandwidth
        | model::ModelError::UnknownNode { .. }
        | model::ModelError::Policy(_) => bad(format!("--model: {e}")),
        _ => internal(format!("--model: {e}")),
    }
}

fn run_model(spec: &MachineSpec, args: &Args<'_>, out: &mut dyn Write) -> Result<(), CliError> {
    for (given, name) in [
        (args.pages.is_some(), "--pages"),
        (args.state.is_some(), "--state"),
        (args.cpu_node.is_some(), "--cpu-node"),
        (args.socket_aware, "--socket-aware"),
    ] {
        if given {
            return Err(bad(format!(
                "--model takes no {name}: it runs every CPU node with each placement"
            )));
        }
    }
    let mask = parse_nodes(spec, args.nodes)?;
    let weights = parse_weights(spec, &mask, args.weights.unwrap_or("auto"))?;
    let topo = spec.topology();
    let cpus = topo.cpu_nodes();
    if cpus.is_empty() {
        return Err(model_error(model::ModelError::NoCpuNodes));
    }
    let res = Resources::from_spec(spec, LinkModel::PerDirection);
    let shared_res = res.with_links(LinkModel::Shared);
    let pages = sample_pages(&weights, &mask, &res, &cpus);

    let (roomy, _) = with_room(spec, &topo.memory_nodes(), pages)?;
    let sim = Sim::new(&roomy).map_err(|e| internal(format!("simulating the machine: {e}")))?;
    let machine = sim
        .boot(BootOptions::default())
        .map_err(|e| internal(format!("boot: {e}")))?;
    machine.set_weights(weights.clone());

    // The seed measured cxl-2socket, weights 3,3,1,1 over all four nodes.
    let seed = preset("cxl-2socket").is_some_and(|p| p == *spec)
        && mask == NodeMask::first_n(4)
        && (0..4).all(|i| weights.get(NodeId::new(i)) == [3, 3, 1, 1][i]);

    let mut rows = Vec::new();
    for scenario in Scenario::ALL {
        let (policy, socket_aware) = scenario.policy(mask);
        let placement =
            model::allocator_placement(&machine, policy, socket_aware, &cpus, pages as usize)
                .map_err(model_error)?;
        let modeled = model::throughput(&res, &placement).map_err(model_error)?;
        let shared = model::throughput(&shared_res, &placement).map_err(model_error)?;
        let memory_bound = placement
            .memory_nodes()
            .iter()
            .filter_map(|n| res.memory_gbps(*n))
            .sum();
        rows.push(ModelRow {
            scenario,
            placement,
            modeled,
            shared,
            measured: seed.then(|| scenario.seed_measured_gbps()),
            memory_bound,
        });
    }
    let note = model_note(&rows);
    if args.json {
        write_model_json(spec, &res, &weights, &mask, pages, &rows, &note, out)
    } else {
        write_model_text(spec, &res, &weights, &mask, pages, &rows, &note, out)
    }
}

/// Two throughputs within 0.5% of each other count as a tie.
fn tie(a: f64, b: f64) -> bool {
    (a - b).abs() <= 0.005 * a.abs().max(b.abs())
}

/// The one-line verdict: where model and measurements disagree (scale, order, bounds the
/// measurements exceed), and what they agree on.
fn model_note(rows: &[ModelRow]) -> String {
    let measured: Vec<(&ModelRow, f64)> = rows
        .iter()
        .filter_map(|r| r.measured.map(|m| (r, m)))
        .collect();
    if measured.is_empty() {
        return "no measurements to compare with: the seed measured cxl-2socket with weights 3,3,1,1 over nodes 0-3 only".to_string();
    }
    let ratios: Vec<f64> = measured
        .iter()
        .map(|(r, m)| m / r.modeled.total_gbps)
        .collect();
    let lo = ratios.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = ratios.iter().copied().fold(0.0, f64::max);
    let mut parts = Vec::new();
    if lo > 1.1 {
        parts.push(format!(
            "on scale, every measurement is {lo:.2}-{hi:.2}x the model"
        ));
    } else if hi < 1.0 / 1.1 {
        parts.push(format!(
            "on scale, every measurement is only {lo:.2}-{hi:.2}x the model"
        ));
    } else if hi / lo > 1.1 {
        parts.push(format!(
            "on scale, measured/modeled ranges from {lo:.2} to {hi:.2}"
        ));
    }
    let above: Vec<String> = measured
        .iter()
        .filter(|(r, m)| *m > r.memory_bound * 1.001)
        .map(|(r, m)| format!("{} {m:.0} > {:.0}", r.scenario.name(), r.memory_bound))
        .collect();
    if !above.is_empty() {
        let who = if above.len() == measured.len() {
            "every measurement exceeds"
        } else {
            "some measurements exceed"
        };
        parts.push(format!(
            "{who} the summed bandwidth of the memory nodes its placement uses ({} GB/s), which no bandwidth model over these capacities can reach",
            above.join(", ")
        ));
    }
    for (i, (a, ma)) in measured.iter().enumerate() {
        for (b, mb) in &measured[i + 1..] {
            let (xa, xb) = (a.modeled.total_gbps, b.modeled.total_gbps);
            let (na, nb) = (a.scenario.name(), b.scenario.name());
            match (tie(xa, xb), tie(*ma, *mb)) {
                (true, false) => parts.push(format!(
                    "on order, the model ties {na} and {nb} at {xa:.0} GB/s where the measurements have {ma:.0} vs {mb:.0}"
                )),
                (false, true) => parts.push(format!(
                    "on order, the model separates {na} and {nb} ({xa:.0} vs {xb:.0} GB/s) where the measurements tie"
                )),
                (false, false) if (xa > xb) != (ma > mb) => parts.push(format!(
                    "on order, the model puts {na} at {xa:.0} and {nb} at {xb:.0} GB/s, the measurements the other way round ({ma:.0} vs {mb:.0})"
                )),
                _ => {}
            }
        }
    }
    let best = |f: &dyn Fn(&(&ModelRow, f64)) -> f64| {
        measured
            .iter()
            .max_by(|x, y| f(x).total_cmp(&f(y)))
            .map(|(r, _)| r.scenario)
    };
    let best_model = best(&|(r, _)| r.modeled.total_gbps);
    let best_measured = best(&|(_, m)| *m);
    let agree = match (best_model, best_measured) {
        (Some(a), Some(b)) if a == b => format!("; both put {} first", a.name()),
        _ => String::new(),
    };
    if parts.is_empty() {
        format!("model and measurements agree: same order, measured/modeled {lo:.2}-{hi:.2}{agree}")
    } else {
        format!(
            "model and measurements disagree: {}{agree}",
            parts.join("; ")
        )
    }
}

fn resource_list(t: &Throughput) -> String {
    t.bottlenecks
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

fn packages_text(spec: &MachineSpec, res: &Resources) -> String {
    let n = spec.len();
    let count = (0..n)
        .filter_map(|i| res.package(NodeId::new(i)))
        .max()
        .map_or(0, |m| m + 1);
    (0..count)
        .map(|p| {
            let nodes = (0..n)
                .map(NodeId::new)
                .filter(|id| res.package(*id) == Some(p));
            format!("p{p} = nodes {}", node_list(nodes))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[allow(clippy::too_many_arguments)]
fn write_model_text(
    spec: &MachineSpec,
    res: &Resources,
    weights: &Weights,
    mask: &NodeMask,
    pages: u64,
    rows: &[ModelRow],
    note: &str,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let cpus = spec.topology().cpu_nodes();
    writeln!(
        out,
        "placement model of {}: packages {}; CPU nodes {}",
        spec.name(),
        packages_text(spec, res),
        node_list(&cpus)
    )?;
    let memory: Vec<String> = (0..spec.len())
        .map(NodeId::new)
        .filter_map(|n| res.memory_gbps(n).map(|bw| format!("node {n} {bw:.0}")))
        .collect();
    let link = res.link_gbps().map_or_else(
        || "none given".to_string(),
        |l| format!("{l:.0} GB/s each direction (full duplex; one link per pair of packages)"),
    );
    writeln!(
        out,
        "resources: memory GB/s {}; socket links {link}",
        memory.join(", ")
    )?;
    writeln!(
        out,
        "modeled throughput = the largest rate r, the same for every CPU node, that keeps every resource within its bandwidth, times {} CPU nodes",
        cpus.count()
    )?;
    writeln!(
        out,
        "weights {} over nodes {}; shares counted from {pages}-page bulk allocations by a fresh task on each CPU node\n",
        weight_list(weights, mask),
        node_list(mask)
    )?;
    writeln!(
        out,
        "{:<34} {:>13} {:>14} {:>17}  bottleneck",
        "placement", "modeled GB/s", "measured GB/s", "measured/modeled"
    )?;
    for r in rows {
        let (measured, ratio) = match r.measured {
            Some(m) => (
                format!("{m:.0}"),
                format!("{:.2}", m / r.modeled.total_gbps),
            ),
            None => ("-".to_string(), "-".to_string()),
        };
        writeln!(
            out,
            "{:<34} {:>13.1} {:>14} {:>17}  {}",
            r.scenario.name(),
            r.modeled.total_gbps,
            measured,
            ratio,
            resource_list(&r.modeled)
        )?;
    }
    writeln!(out, "\nwhere each CPU node's pages went:")?;
    for r in rows {
        let cpus: Vec<String> = r
            .placement
            .rows()
            .iter()
            .map(|(cpu, shares)| {
                let s: Vec<String> = shares
                    .iter()
                    .map(|(n, f)| format!("{n} {:.1}%", 100.0 * f))
                    .collect();
                format!("cpu node {cpu} -> {}", s.join(", "))
            })
            .collect();
        writeln!(out, "  {}: {}", r.scenario.name(), cpus.join("; "))?;
    }
    let shared: Vec<String> = rows
        .iter()
        .map(|r| format!("{} {:.1}", r.scenario.name(), r.shared.total_gbps))
        .collect();
    writeln!(
        out,
        "with one shared link per pair of packages instead (both directions in {}), the model gives: {} GB/s",
        res.link_gbps()
            .map_or_else(|| "-".to_string(), |l| format!("{l:.0} GB/s")),
        shared.join(", ")
    )?;
    writeln!(out, "note: {note}")?;
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn write_model_json(
    spec: &MachineSpec,
    res: &Resources,
    weights: &Weights,
    mask: &NodeMask,
    pages: u64,
    rows: &[ModelRow],
    note: &str,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    #[derive(Serialize)]
    struct Row<'a> {
        name: &'static str,
        modeled_gbps: f64,
        shared_link_gbps: f64,
        measured_gbps: Option<f64>,
        measured_over_modeled: Option<f64>,
        bottlenecks: Vec<String>,
        #[serde(serialize_with = "by_node")]
        shares: Vec<(NodeId, ByNode<'a, f64>)>,
    }
    #[derive(Serialize)]
    struct Doc<'a> {
        machine: &'a str,
        links: &'static str,
        link_gbps: Option<f64>,
        cpu_nodes: Vec<usize>,
        packages: Vec<usize>,
        #[serde(serialize_with = "by_node")]
        weights: Vec<(NodeId, u8)>,
        sample_pages: u64,
        placements: Vec<Row<'a>>,
        note: &'a str,
    }
    let doc = Doc {
        machine: spec.name(),
        links: res.links().name(),
        link_gbps: res.link_gbps(),
        cpu_nodes: spec
            .topology()
            .cpu_nodes()
            .iter()
            .map(|n| n.index())
            .collect(),
        packages: (0..spec.len())
            .filter_map(|i| res.package(NodeId::new(i)))
            .collect(),
        weights: mask.iter().map(|n| (n, weights.get(n))).collect(),
        sample_pages: pages,
        placements: rows
            .iter()
            .map(|r| Row {
                name: r.scenario.name(),
                modeled_gbps: r.modeled.total_gbps,
                shared_link_gbps: r.shared.total_gbps,
                measured_gbps: r.measured,
                measured_over_modeled: r.measured.map(|m| m / r.modeled.total_gbps),
                bottlenecks: r
                    .modeled
                    .bottlenecks
                    .iter()
                    .map(ToString::to_string)
                    .collect(),
                shares: r
                    .placement
                    .rows()
                    .iter()
                    .map(|(cpu, s)| (*cpu, ByNode(s)))
                    .collect(),
            })
            .collect(),
        note,
    };
    serde_json::to_writer(&mut *out, &doc)?;
    writeln!(out)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn sample_is_whole_rounds() {
        let spec = cxl();
        let res = Resources::from_spec(&spec, LinkModel::PerDirection);
        let w = Weights::new(&[3, 3, 1, 1]).unwrap();
        let s = sample_pages(
            &w,
            &NodeMask::first_n(4),
            &res,
            &spec.topology().cpu_nodes(),
        );
        assert_eq!(s, MODEL_SAMPLE_PAGES);
        let w = Weights::new(&[5, 3, 1, 1]).unwrap();
        let s = sample_pages(
            &w,
            &NodeMask::first_n(4),
            &res,
            &spec.topology().cpu_nodes(),
        );
        // Rounds 10 (all), 6 (package 0), 4 (package 1): lcm 60.
        assert_eq!(s % 60, 0);
        assert!((MODEL_SAMPLE_PAGES..MODEL_SAMPLE_PAGES + 60).contains(&s));
    }

    fn row(scenario: Scenario, modeled: f64, measured: f64, bound: f64) -> ModelRow {
        let t = Throughput {
            total_gbps: modeled,
            per_cpu_node_gbps: modeled / 2.0,
            bottlenecks: vec![],
            loads: vec![],
        };
        ModelRow {
            scenario,
            placement: Placement::new(vec![(n(0), vec![(n(0), 1.0)])]).unwrap(),
            modeled: t.clone(),
            shared: t,
            measured: Some(measured),
            memory_bound: bound,
        }
    }

    #[test]
    fn note_says_where_they_disagree() {
        let rows = [
            row(Scenario::LocalDram, 600.0, 966.0, 600.0),
            row(Scenario::FlatInterleave, 600.0, 903.0, 800.0),
            row(Scenario::SocketAwareInterleave, 800.0, 1329.0, 800.0),
        ];
        let note = model_note(&rows);
        assert!(!note.contains('\n'));
        assert!(
            note.starts_with("model and measurements disagree: "),
            "{note}"
        );
        assert!(note.contains("1.50-1.66x"), "{note}");
        assert!(
            note.contains("every measurement exceeds the summed bandwidth of the memory nodes its placement uses (local DRAM only 966 > 600, flat weighted interleave 903 > 800, socket-aware weighted interleave 1329 > 800 GB/s)"),
            "{note}"
        );
        assert!(
            note.contains("ties local DRAM only and flat weighted interleave at 600"),
            "{note}"
        );
        assert!(
            note.ends_with("both put socket-aware weighted interleave first"),
            "{note}"
        );

        let agree = [
            row(Scenario::LocalDram, 600.0, 620.0, 1000.0),
            row(Scenario::FlatInterleave, 500.0, 505.0, 1000.0),
        ];
        let note = model_note(&agree);
        assert!(note.starts_with("model and measurements agree"), "{note}");

        let swapped = [
            row(Scenario::LocalDram, 600.0, 500.0, 1000.0),
            row(Scenario::FlatInterleave, 500.0, 600.0, 1000.0),
        ];
        assert!(model_note(&swapped).contains("the other way round"));
        let mut none = row(Scenario::LocalDram, 1.0, 1.0, 1.0);
        none.measured = None;
        assert!(model_note(&[none]).starts_with("no measurements"));
    }
}
