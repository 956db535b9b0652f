//! `numaframe interleave --model`: the placement model of [`crate::model`] over every CPU
//! node (local DRAM only, flat and socket-aware weighted interleave), next to the seed's
//! measurements on cxl-2socket, with a one-line verdict of where they disagree.
#![deny(unsafe_code)]

use std::io::Write;

use numaframe::interleave::Weights;
use numaframe::{BootOptions, NodeId, NodeMask};
use serde::Serialize;

use super::{
    Args, ByNode, MODEL_SAMPLE_PAGES, bad, by_node, internal, node_list, parse_nodes,
    parse_weights, weight_list, with_room,
};
use crate::error::CliError;
use crate::model::{self, LinkModel, Placement, Resources, Scenario, Throughput};
use crate::presets::preset;
use crate::sim::Sim;
use crate::spec::MachineSpec;

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

pub(super) fn run_model(
    spec: &MachineSpec,
    args: &Args,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CliError> {
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
    let mask = parse_nodes(spec, args.nodes.as_deref())?;
    let weights = parse_weights(spec, &mask, args.weights.as_deref().unwrap_or("auto"))?;
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
    if json {
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

    fn n(i: usize) -> NodeId {
        NodeId::new(i)
    }

    #[test]
    fn sample_is_whole_rounds() {
        let spec = preset("cxl-2socket").unwrap();
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
