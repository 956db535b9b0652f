//! `numaframe demo`: boots a simulated machine and shows what the allocator does with it.

use std::io::Write;
use std::time::Instant;

use numaframe::{AllocFlags, BootOptions, Machine, NodeId, Order, Pfn};
use serde_json::{Value, json};

use crate::cli::CliError;
use crate::sim::Sim;
use crate::spec::MachineSpec;

fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

fn io(e: std::io::Error) -> CliError {
    CliError::Internal(e.to_string())
}

/// Runs the demo on `spec`, printing the boot log and the results as text or one JSON document.
///
/// # Errors
/// [`CliError::Internal`] if the machine cannot be simulated or booted.
pub fn run(spec: &MachineSpec, json: bool, out: &mut dyn Write) -> Result<(), CliError> {
    let sim = Sim::new(spec).map_err(io)?;
    let t0 = Instant::now();
    let machine = sim
        .boot(BootOptions::default())
        .map_err(|e| CliError::Internal(format!("boot: {e}")))?;
    let boot_ms = t0.elapsed().as_secs_f64() * 1e3;
    let total_bytes = spec.total_memory_bytes();
    let managed: u64 = machine.nodes().iter().map(|n| n.managed_pages()).sum();
    let reserved_bytes = total_bytes - managed * numaframe::PAGE_SIZE;
    let touched = sim.memory().resident_bytes();

    let mut fallback = Vec::new();
    machine.for_each_fallback_line(|line| fallback.push(line.to_string()));
    let placements = local_allocations(&machine);

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
            "fallback": fallback,
            "placements": placements,
            "numastat": numastat_json(&machine),
        });
        writeln!(out, "{doc}").map_err(io)?;
        return Ok(());
    }
    writeln!(
        out,
        "numaframe demo: machine {}, {} nodes, {}",
        spec.name(),
        spec.len(),
        gib(total_bytes)
    )
    .map_err(io)?;
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
        writeln!(out, "{line}").map_err(io)?;
    }
    for line in &fallback {
        writeln!(out, "{line}").map_err(io)?;
    }
    writeln!(
        out,
        "Booted {} in {boot_ms:.2} ms: {managed} pages managed, metadata reserved {} ({:.3}%), {:.1} MiB of it touched",
        gib(total_bytes),
        gib(reserved_bytes),
        100.0 * reserved_bytes as f64 / total_bytes.max(1) as f64,
        touched as f64 / (1 << 20) as f64,
    )
    .map_err(io)?;
    writeln!(
        out,
        "\nLocal allocations (1024 single pages, then a bulk of 4096, from each CPU node):"
    )
    .map_err(io)?;
    for p in placements.as_array().into_iter().flatten() {
        writeln!(out, "  cpu node {}: {}", p["cpu_node"], p["landed"]).map_err(io)?;
    }
    writeln!(out, "\nnumastat:").map_err(io)?;
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
    .map_err(io)?;
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
        .map_err(io)?;
    }
    Ok(())
}

/// From each CPU node: 1024 single-page allocations and one bulk of 4096, freed again.
fn local_allocations(machine: &Machine<'_>) -> Value {
    let mut rows = Vec::new();
    for cpu in machine
        .topology()
        .node_ids()
        .filter(|n| machine.topology().info(*n).has_cpus)
    {
        let mut frames: Vec<Pfn> = (0..1024)
            .filter_map(|_| machine.alloc(cpu, Order::ZERO, AllocFlags::empty()))
            .collect();
        let mut bulk = vec![Pfn(0); 4096];
        let got = machine.alloc_bulk(cpu, AllocFlags::empty(), &mut bulk);
        frames.extend_from_slice(&bulk[..got]);
        rows.push(json!({ "cpu_node": cpu.index(), "landed": landed(machine, &frames) }));
        for p in frames {
            machine
                .free(p, Order::ZERO)
                .expect("frames the demo allocated");
        }
    }
    Value::Array(rows)
}

/// Pages per node, as a JSON object keyed by node id.
fn landed(machine: &Machine<'_>, frames: &[Pfn]) -> Value {
    let mut counts = std::collections::BTreeMap::<usize, u64>::new();
    for p in frames {
        *counts
            .entry(machine.node_of(*p).map_or(usize::MAX, NodeId::index))
            .or_default() += 1;
    }
    Value::Object(
        counts
            .into_iter()
            .map(|(k, v)| (k.to_string(), Value::from(v)))
            .collect(),
    )
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
