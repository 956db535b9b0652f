//! `numaframe demo`: boots a simulated machine and shows what the allocator does with it: the
//! boot log, a huge-page reservation, every memory policy, the per-CPU caches and numastat.
#![deny(unsafe_code)]

use std::collections::BTreeMap;
use std::io::Write;
use std::time::Instant;

use numaframe::HugeSize;
use numaframe::hugetlb::ReservationPlan;
use numaframe::hugetlb::cmdline;
use numaframe::policy::{Policy, TaskPolicy, auto_weights};
use numaframe::{
    AllocFlags, BootOptions, Machine, NodeId, NodeMask, Order, Pfn, TablePlace, ZoneKind,
};
use serde_json::{Value, json};

use super::hugepages::{default_threads, reserve};
use super::metadata::Metadata;
use super::source::load_preset;
use crate::error::CliError;
use crate::presets::PRESETS;
use crate::sim::Sim;
use crate::spec::MachineSpec;

/// The options of `numaframe demo`.
#[derive(clap::Args, Clone, Debug, Default)]
#[command(override_usage = "numaframe demo [--preset NAME] [--report] [--json]")]
pub struct Args {
    /// The built-in machine to boot [default: cxl-2socket]
    #[arg(long, value_name = "NAME", long_help = preset_help(),
          value_parser = clap::builder::NonEmptyStringValueParser::new())]
    pub preset: Option<String>,
    /// Also run a guest, tear it down and report the free memory to Linux (madvise), showing
    /// the process's resident memory fall
    #[arg(long)]
    pub report: bool,
}

fn preset_help() -> String {
    format!(
        "The built-in machine to boot [default: cxl-2socket; presets: {}]",
        PRESETS.join(", ")
    )
}

/// Runs `numaframe demo`.
///
/// # Errors
/// [`CliError::BadInput`] for an unknown preset, [`CliError::Internal`] as [`run`].
pub fn command(args: &Args, json: bool, out: &mut dyn Write) -> Result<(), CliError> {
    let spec = load_preset(args.preset.as_deref().unwrap_or("cxl-2socket"))?;
    run_with(&spec, json, args.report, out)
}

fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

fn internal(e: impl std::fmt::Display) -> CliError {
    CliError::Internal(e.to_string())
}

/// Pages per node of a set of frames.
fn landed(machine: &Machine<'_>, frames: &[Pfn]) -> BTreeMap<usize, u64> {
    let mut counts = BTreeMap::new();
    for p in frames {
        *counts
            .entry(machine.node_of(*p).map_or(usize::MAX, NodeId::index))
            .or_default() += 1;
    }
    counts
}

fn counts_text(counts: &BTreeMap<usize, u64>) -> String {
    let parts: Vec<String> = counts
        .iter()
        .map(|(n, c)| format!("node {n}: {c}"))
        .collect();
    if parts.is_empty() {
        "nothing".into()
    } else {
        parts.join(", ")
    }
}

/// One row of the policy table.
struct PolicyRun {
    name: String,
    cpu_node: NodeId,
    counts: BTreeMap<usize, u64>,
    node_calls: usize,
}

/// The huge-page command line the demo reserves: a quarter of each node's memory in 1 GiB pages
/// where the node is big enough, and 512 2 MiB pages spread over the nodes.
fn demo_cmdline(spec: &MachineSpec) -> String {
    let gig: Vec<String> = spec
        .nodes()
        .iter()
        .enumerate()
        .filter(|(_, n)| n.memory_bytes >= 8 << 30)
        .map(|(i, n)| format!("{i}:{}", (n.memory_bytes >> 30) / 4))
        .collect();
    let mut line = String::from("hugepagesz=2M hugepages=512");
    if !gig.is_empty() {
        line = format!("hugepagesz=1G hugepages={} {line}", gig.join(","));
    }
    line
}

/// Runs the demo on `spec`, printing the boot log and the results as text or one JSON document.
///
/// # Errors
/// [`CliError::Internal`] if the machine cannot be simulated or booted.
pub fn run(spec: &MachineSpec, json: bool, out: &mut dyn Write) -> Result<(), CliError> {
    run_with(spec, json, false, out)
}

/// Runs the demo on `spec` as [`run`], with the free-page reporting part if `report`.
///
/// # Errors
/// As [`run`].
pub fn run_with(
    spec: &MachineSpec,
    json: bool,
    report: bool,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let sim = Sim::new(spec).map_err(internal)?;
    // One CPU per node with CPUs is enough to show the caches; the spec's CPU count is printed.
    let cpus: Vec<NodeId> = (0..spec.len())
        .filter(|i| !spec.nodes()[*i].cpus.is_empty())
        .map(NodeId::new)
        .collect();
    let t0 = Instant::now();
    let machine = sim
        .boot(BootOptions {
            cpus: &cpus,
            ..BootOptions::default()
        })
        .map_err(|e| internal(format!("boot: {e}")))?
        // Its reports go back to Linux through `madvise(MADV_DONTNEED)`, which zeroes.
        .with_zeroing_host();
    let boot_ms = t0.elapsed().as_secs_f64() * 1e3;
    let total_bytes = spec.total_memory_bytes();
    let managed: u64 = machine.nodes().iter().map(|n| n.managed_pages()).sum();
    let reserved_bytes = total_bytes - managed * numaframe::PAGE_SIZE;
    let touched = sim.memory().resident_bytes();
    let meta_boot = Metadata::of(&machine);
    let mut fallback = Vec::new();
    machine.for_each_fallback_line(|line| fallback.push(line.to_string()));
    let node_tables: Vec<TablePlace> = machine
        .topology()
        .node_ids()
        .filter_map(|n| machine.node_tables(n))
        .collect();

    // Huge pages, reserved by parallel jobs as at boot.
    let line = demo_cmdline(spec);
    let config = cmdline::parse(&line).map_err(internal)?;
    let mut plan = ReservationPlan::new(&config, &machine).map_err(internal)?;
    let threads = default_threads();
    let t1 = Instant::now();
    reserve(&mut plan, &machine, threads);
    let huge_ms = t1.elapsed().as_secs_f64() * 1e3;
    let meta_huge = Metadata::of(&machine);
    let huge_log: Vec<String> = plan
        .report(&machine)
        .lines()
        .map(|l| l.to_string())
        .collect();
    let mut huge_pools = Vec::new();
    for size in HugeSize::ALL {
        let per_node: BTreeMap<usize, u64> = machine
            .topology()
            .node_ids()
            .map(|n| (n.index(), machine.huge_counts(n, size).total))
            .collect();
        huge_pools.push((size, per_node));
    }

    let policies = run_policies(spec, &machine)?;
    let pcp = per_cpu_round_trip(&machine);
    let scrub = background_scrub(&machine);
    let reporting = report.then(|| super::demo_report::guest_teardown(&sim, &machine));

    if json {
        let doc = json!({
            "machine": spec.name(),
            "nodes": spec.len(),
            "memory_bytes": total_bytes,
            "boot_ms": boot_ms,
            "managed_pages": managed,
            "metadata_bytes": reserved_bytes,
            "metadata_percent": 100.0 * reserved_bytes as f64 / total_bytes.max(1) as f64,
            "resident_bytes": touched,
            "allocator_metadata": {"boot": meta_boot, "after_hugepages": meta_huge},
            "fallback": fallback,
            "node_tables": node_tables.iter().enumerate().map(|(i, t)| json!({"node": i, "host": t.host.index(), "start": t.frames.start().addr().get(), "bytes": t.frames.bytes()})).collect::<Vec<_>>(),
            "hugepages": {
                "cmdline": line, "threads": threads, "elapsed_ms": huge_ms, "log": huge_log,
                "pools": huge_pools.iter().map(|(s, per)| json!({"size_kib": s.kib(), "per_node": per})).collect::<Vec<_>>(),
            },
            "policies": policies.iter().map(|p| json!({"policy": p.name, "cpu_node": p.cpu_node.index(), "counts": p.counts, "node_calls": p.node_calls})).collect::<Vec<_>>(),
            "per_cpu": pcp,
            "numastat": numastat_json(&machine),
            "scrub": scrub.json(),
        });
        let mut doc = doc;
        if let Some(r) = &reporting {
            doc["report"] = r.json();
        }
        writeln!(out, "{doc}").map_err(internal)?;
        return Ok(());
    }
    writeln!(
        out,
        "numaframe demo: machine {}, {} nodes, {}",
        spec.name(),
        spec.len(),
        gib(total_bytes)
    )
    .map_err(internal)?;
    for (i, node) in spec.nodes().iter().enumerate() {
        let cpus = if node.cpus.is_empty() {
            "no CPUs".to_string()
        } else {
            format!("{} CPUs", node.cpus.len())
        };
        let mut line = format!("  node {i}: {}, {cpus}", gib(node.memory_bytes));
        if let Some(s) = node.socket {
            line += &format!(", socket {s}");
        }
        if let Some(init) = node.initiator {
            line += &format!(", initiator {init}");
        }
        if let Some(bw) = node.bandwidth_gbps {
            line += &format!(", {bw} GB/s");
        }
        writeln!(out, "{line}").map_err(internal)?;
    }
    for (i, t) in node_tables.iter().enumerate() {
        // Linux's boot log of each node's `pglist_data`, and where a node without memory got it.
        let (start, end) = (t.frames.start().addr().get(), t.frames.end().addr().get());
        writeln!(
            out,
            "NODE_DATA({i}) allocated [mem {start:#010x}-{:#010x}]",
            end - 1
        )
        .map_err(internal)?;
        if t.host.index() != i {
            writeln!(out, "    NODE_DATA({i}) on node {}", t.host).map_err(internal)?;
        }
    }
    for line in &fallback {
        writeln!(out, "{line}").map_err(internal)?;
    }
    writeln!(
        out,
        "Booted {} in {boot_ms:.2} ms: {managed} pages managed, metadata reserved {} ({:.3}%), {:.1} MiB of it touched",
        gib(total_bytes),
        gib(reserved_bytes),
        100.0 * reserved_bytes as f64 / total_bytes.max(1) as f64,
        touched as f64 / (1 << 20) as f64,
    )
    .map_err(internal)?;
    writeln!(out, "Allocator metadata after boot: {meta_boot}").map_err(internal)?;

    writeln!(out, "\nHuge pages from \"{line}\":").map_err(internal)?;
    for l in &huge_log {
        writeln!(out, "{l}").map_err(internal)?;
    }
    writeln!(
        out,
        "HugeTLB: allocation took {huge_ms:.2} ms with {threads} threads"
    )
    .map_err(internal)?;
    for (size, per) in &huge_pools {
        let row: Vec<String> = per.iter().map(|(n, c)| format!("{n}:{c}")).collect();
        writeln!(
            out,
            "  {} pool per node: {}",
            cmdline::format_size(*size),
            row.join(" ")
        )
        .map_err(internal)?;
    }
    writeln!(out, "Allocator metadata after the huge pages: {meta_huge}").map_err(internal)?;

    writeln!(out, "\nPolicies (a bulk of 4096 pages each, then freed):").map_err(internal)?;
    for p in &policies {
        writeln!(
            out,
            "  {:<66} from node {}: {} ({} node calls)",
            p.name,
            p.cpu_node,
            counts_text(&p.counts),
            p.node_calls
        )
        .map_err(internal)?;
    }
    writeln!(out, "\nPer-CPU caches: {pcp}").map_err(internal)?;
    writeln!(out, "\n{}", scrub.text()).map_err(internal)?;
    if let Some(r) = &reporting {
        writeln!(out, "\n{}", r.text()).map_err(internal)?;
    }

    writeln!(out, "\nnumastat:").map_err(internal)?;
    writeln!(
        out,
        "  {:>5} {:>10} {:>10} {:>12} {:>14} {:>10} {:>10}",
        "node",
        "numa_hit",
        "numa_miss",
        "numa_foreign",
        "interleave_hit",
        "local_node",
        "other_node"
    )
    .map_err(internal)?;
    for id in machine.topology().node_ids() {
        let s = machine.numastat(id).unwrap_or_default();
        writeln!(
            out,
            "  {:>5} {:>10} {:>10} {:>12} {:>14} {:>10} {:>10}",
            id.index(),
            s.numa_hit,
            s.numa_miss,
            s.numa_foreign,
            s.interleave_hit,
            s.local_node,
            s.other_node
        )
        .map_err(internal)?;
    }
    Ok(())
}

/// Every policy once, from the first CPU node; weighted interleave flat and socket-aware from
/// every CPU node. Each bulk is freed again.
fn run_policies(spec: &MachineSpec, machine: &Machine<'_>) -> Result<Vec<PolicyRun>, CliError> {
    let topo = machine.topology();
    let memory = machine.memory_nodes();
    let cpu_nodes: Vec<NodeId> = topo.node_ids().filter(|n| topo.info(*n).has_cpus).collect();
    let Some(&home) = cpu_nodes.first() else {
        return Ok(Vec::new());
    };
    let other = memory.iter().find(|n| *n != home).unwrap_or(home);
    let far = NodeMask::from_nodes(memory.iter().filter(|n| *n != home));
    let far = if far.is_empty() { memory } else { far };
    let with_bw = spec
        .nodes()
        .iter()
        .all(|n| n.memory_bytes == 0 || n.bandwidth_gbps.is_some());
    if with_bw && let Ok(w) = auto_weights(topo, &memory) {
        machine.set_weights(w);
    }
    let weights_name = if with_bw { "auto weights" } else { "weights 1" };
    let mut runs: Vec<(String, NodeId, Policy, bool)> = vec![
        ("Local".into(), home, Policy::Local, false),
        (
            format!("Preferred({other})"),
            home,
            Policy::Preferred(other),
            false,
        ),
        (
            format!("PreferredMany({far:?})"),
            home,
            Policy::PreferredMany(far),
            false,
        ),
        (format!("Bind({far:?})"), home, Policy::Bind(far), false),
        (
            format!("Interleave({memory:?})"),
            home,
            Policy::Interleave(memory),
            false,
        ),
    ];
    for &cpu in &cpu_nodes {
        runs.push((
            format!("WeightedInterleave({memory:?}), {weights_name}"),
            cpu,
            Policy::WeightedInterleave(memory),
            false,
        ));
        runs.push((
            format!("WeightedInterleave({memory:?}), {weights_name}, socket-aware"),
            cpu,
            Policy::WeightedInterleave(memory),
            true,
        ));
    }
    let mut rows = Vec::new();
    let mut frames = vec![Pfn::new(0); 4096];
    for (name, cpu, policy, socket_aware) in runs {
        let mut task = TaskPolicy::new(machine, policy, socket_aware).map_err(internal)?;
        let r = task.alloc_bulk(machine, cpu, AllocFlags::empty(), &mut frames);
        rows.push(PolicyRun {
            name,
            cpu_node: cpu,
            counts: landed(machine, &frames[..r.placed]),
            node_calls: r.node_calls,
        });
        machine.free_bulk(&frames[..r.placed]).map_err(internal)?;
    }
    Ok(rows)
}

/// Each registered CPU allocates and frees 1000 order-0 frames through its cache.
fn per_cpu_round_trip(machine: &Machine<'_>) -> String {
    let mut held = Vec::new();
    let mut parts = Vec::new();
    for i in 0..machine.cpu_count() {
        let Some(cpu) = machine.cpu(i) else { continue };
        let frames: Vec<Pfn> = (0..1000)
            .filter_map(|_| machine.alloc_cpu(cpu, Order::ZERO, AllocFlags::empty()))
            .collect();
        parts.push(format!(
            "{cpu} on node {}: {}",
            machine.cpu_node(cpu).map_or(0, NodeId::index),
            counts_text(&landed(machine, &frames))
        ));
        held.push((cpu, frames));
    }
    for (cpu, frames) in held {
        for p in frames {
            // The demo frees exactly the frames it allocated.
            let _ = machine.free_cpu(cpu, p, Order::ZERO);
        }
    }
    let cached = machine.cached_pages();
    machine.drain_all();
    format!(
        "{}; {cached} frames left cached, then drained",
        parts.join("; ")
    )
}

/// Frames one background scrub thread clears per node in the demo (64 MiB): enough to show
/// the counters move without clearing a 12 TiB machine.
const SCRUB_BUDGET: u64 = 16 << 10;

/// Dirty free frames per node and zone before and after a bounded background scrub.
struct ScrubReport {
    budget: u64,
    elapsed_ms: f64,
    /// `(node, [Dma32, Normal] before, [Dma32, Normal] after)`.
    nodes: Vec<(usize, [u64; 2], [u64; 2])>,
}

fn dirty_by_zone(machine: &Machine<'_>, id: NodeId) -> [u64; 2] {
    machine.node(id).map_or([0; 2], |n| {
        ZoneKind::ALL.map(|k| n.zone(k).counters().dirty)
    })
}

/// Scrubs every memory node on a thread of its own (as idle CPUs near each node would), up to
/// [`SCRUB_BUDGET`] frames each.
fn background_scrub(machine: &Machine<'_>) -> ScrubReport {
    let ids: Vec<NodeId> = machine.memory_nodes().iter().collect();
    let before: Vec<[u64; 2]> = ids.iter().map(|&id| dirty_by_zone(machine, id)).collect();
    let t = Instant::now();
    std::thread::scope(|s| {
        for &id in &ids {
            s.spawn(move || {
                let mut left = SCRUB_BUDGET;
                while left > 0 {
                    let step = left.min(4096);
                    let dirty = machine.node(id).map_or(0, |n| n.dirty_pages());
                    if dirty == 0 || machine.scrub(id, step) == dirty {
                        break;
                    }
                    left -= step;
                }
            });
        }
    });
    let elapsed_ms = t.elapsed().as_secs_f64() * 1e3;
    ScrubReport {
        budget: SCRUB_BUDGET,
        elapsed_ms,
        nodes: ids
            .iter()
            .zip(before)
            .map(|(&id, b)| (id.index(), b, dirty_by_zone(machine, id)))
            .collect(),
    }
}

impl ScrubReport {
    fn json(&self) -> Value {
        json!({
            "budget_frames_per_node": self.budget,
            "elapsed_ms": self.elapsed_ms,
            "dirty": self.nodes.iter().map(|(n, b, a)| json!({
                "node": n,
                "before": {"dma32": b[0], "normal": b[1]},
                "after": {"dma32": a[0], "normal": a[1]},
            })).collect::<Vec<_>>(),
        })
    }

    fn text(&self) -> String {
        let mut s = format!(
            "Background scrub ({} frames per node, {:.1} ms), dirty free frames per zone:\n  {:>5} {:>14} {:>14}",
            self.budget, self.elapsed_ms, "node", "Dma32", "Normal"
        );
        for (n, b, a) in &self.nodes {
            s.push_str(&format!(
                "\n  {n:>5} {:>14} {:>14}",
                format!("{} -> {}", b[0], a[0]),
                format!("{} -> {}", b[1], a[1])
            ));
        }
        s
    }
}

fn numastat_json(machine: &Machine<'_>) -> Value {
    Value::Array(
        machine
            .topology()
            .node_ids()
            .map(|id| {
                let s = machine.numastat(id).unwrap_or_default();
                json!({"node": id.index(), "numa_hit": s.numa_hit, "numa_miss": s.numa_miss, "numa_foreign": s.numa_foreign,
                       "interleave_hit": s.interleave_hit, "local_node": s.local_node, "other_node": s.other_node})
            })
            .collect(),
    )
}
