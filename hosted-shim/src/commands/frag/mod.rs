//! `numaframe frag`: boots a topology over simulated memory, runs a workload
//! ([`workload`]), and reports fragmentation as Linux does: the unusable free space index per
//! order (`/sys/kernel/debug/extfrag/unusable_index`), pageblocks per state and class
//! (`/proc/pagetypeinfo`'s "Number of blocks type" table), the allocator's metadata, and with
//! `--svg` a picture of every node's pageblocks ([`picture`]).
//!
//! A workload uses at most `--max-gib` GiB of each node (all of a smaller node), and at most
//! [`MAX_WORKLOAD_GIB`] GiB over the machine: the workload keeps a list of the frames it holds,
//! and its time grows with them. The rest of a large node stays as booted.
#![deny(unsafe_code)]

pub mod picture;
pub mod workload;

use std::fs::File;
use std::io::Write;
use std::path::PathBuf;

use numaframe::addr::NR_ORDERS;
use numaframe::{BootOptions, Machine, NodeId, Order, ZoneKind};
use serde::Serialize;

use self::picture::NodeMap;
pub use self::workload::{NodeSummary, Workload};
use super::metadata::Metadata;
use super::source::Source;
use crate::error::CliError;
use crate::sim::Sim;
use crate::spec::MachineSpec;

/// Rounds (`churn`) or days (`guests`) without `--rounds`.
pub const DEFAULT_ROUNDS: u32 = 20;
/// `--max-gib` when not given.
pub const DEFAULT_MAX_GIB: u64 = 4;
/// The most memory a workload may use over all nodes, in GiB.
pub const MAX_WORKLOAD_GIB: u64 = 64;
/// The seed without `--seed`.
pub const DEFAULT_SEED: u64 = 1;

const GIB: u64 = 1 << 30;

/// What `numaframe help frag` prints after the options.
const AFTER: &str = "\
Workloads (each node on its own, at most --max-gib GiB of it, at most 64 GiB in all):
  none    the machine as booted
  churn   fill with 4 KiB frames, free a random 50%, then R rounds that each free a random 10% and allocate as many again
  guests  a host's long-lived 4 KiB frames; guests backed by 1 GiB, 2 MiB and 4 KiB frames, one torn down a day; short-lived I/O buffers; R days

Prints /sys/kernel/debug/extfrag/unusable_index lines (orders 0..18), /proc/pagetypeinfo's \"Number of blocks type\" table (Free, Whole, Long-lived, Short-lived; Cached: of the split ones, lent to a CPU) and the allocator's metadata. --svg FILE draws every node's pageblocks.";

/// The options of `numaframe frag`.
#[derive(clap::Args, Clone, Debug, Default)]
#[command(
    override_usage = "numaframe frag <topology> [--workload none|churn|guests] [--rounds R] [--seed N] [--max-gib G] [--svg FILE] [--json]",
    after_long_help = AFTER
)]
pub struct Args {
    /// What runs before the report
    #[arg(long, value_enum, value_name = "W", default_value_t)]
    pub workload: Workload,
    /// Rounds of churn, or days of guests [default: 20]
    #[arg(long, value_name = "R", value_parser = clap::value_parser!(u32).range(0..=1000))]
    pub rounds: Option<u32>,
    /// The seed of the workload's random choices [default: 1]
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
    /// The most memory of each node the workload uses, in GiB [default: 4]
    #[arg(long, value_name = "G",
          value_parser = clap::value_parser!(u64).range(1..=MAX_WORKLOAD_GIB))]
    pub max_gib: Option<u64>,
    /// Draw every node's pageblocks into this SVG file
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// The machine.
    #[command(flatten, next_help_heading = "Topology (exactly one)")]
    pub source: Source,
}

/// The workload's settings, checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Plan {
    /// The workload.
    pub workload: Workload,
    /// Rounds or days (`None` for `none`).
    pub rounds: Option<u32>,
    /// The seed (`None` for `none`).
    pub seed: Option<u64>,
    /// GiB per node at most (`None` for `none`).
    pub max_gib: Option<u64>,
}

impl Plan {
    /// The plan `args` ask for on `spec`.
    ///
    /// # Errors
    /// [`CliError::BadInput`] for `--rounds`, `--seed` or `--max-gib` without a workload, or
    /// a workload that would use more than [`MAX_WORKLOAD_GIB`] GiB.
    pub fn new(args: &Args, spec: &MachineSpec) -> Result<Plan, CliError> {
        if args.workload == Workload::None {
            let given = [
                ("--rounds", args.rounds.is_some()),
                ("--seed", args.seed.is_some()),
                ("--max-gib", args.max_gib.is_some()),
            ];
            if let Some((flag, _)) = given.iter().find(|g| g.1) {
                return Err(CliError::BadInput(format!(
                    "`{flag}` needs `--workload churn` or `--workload guests`"
                )));
            }
            return Ok(Plan {
                workload: Workload::None,
                rounds: None,
                seed: None,
                max_gib: None,
            });
        }
        let max_gib = args.max_gib.unwrap_or(DEFAULT_MAX_GIB);
        let used: u64 = spec
            .nodes()
            .iter()
            .map(|n| n.memory_bytes.min(max_gib * GIB))
            .sum();
        if used > MAX_WORKLOAD_GIB * GIB {
            return Err(CliError::BadInput(format!(
                "`--max-gib {max_gib}`: the workload would use {:.1} GiB over {} nodes, more than the {MAX_WORKLOAD_GIB} GiB it may use in all; give a smaller --max-gib",
                used as f64 / GIB as f64,
                spec.len()
            )));
        }
        Ok(Plan {
            workload: args.workload,
            rounds: Some(args.rounds.unwrap_or(DEFAULT_ROUNDS)),
            seed: Some(args.seed.unwrap_or(DEFAULT_SEED)),
            max_gib: Some(max_gib),
        })
    }
}

/// Runs `numaframe frag`.
///
/// # Errors
/// [`CliError::BadInput`] for a bad topology, bad options (see [`Plan::new`]) or an SVG file
/// that cannot be created; [`CliError::Internal`] as [`run`].
pub fn command(args: &Args, json: bool, out: &mut dyn Write) -> Result<(), CliError> {
    let spec = args.source.machine()?;
    let plan = Plan::new(args, &spec)?;
    // Created before the workload runs, so a bad path fails at once.
    let svg = match &args.svg {
        Some(path) => Some((
            path,
            File::create(path).map_err(|e| {
                CliError::BadInput(format!(
                    "`--svg {}`: cannot create the file: {e}",
                    path.display()
                ))
            })?,
        )),
        None => None,
    };
    run(&spec, &plan, svg, json, out)
}

/// Linux's name of a zone.
fn zone_name(kind: ZoneKind) -> &'static str {
    match kind {
        ZoneKind::Dma32 => "DMA32",
        _ => "Normal",
    }
}

/// One zone's report.
#[derive(Clone, Debug, Serialize)]
pub struct ZoneReport {
    /// The node.
    pub node: usize,
    /// Linux's zone name.
    pub zone: &'static str,
    /// Frames the zone manages.
    pub managed_pages: u64,
    /// Free frames.
    pub free_pages: u64,
    /// The unusable free space index per order 0..=18, as Linux prints it (three decimals).
    pub unusable_index: Vec<f64>,
    /// Per order, the free frames outside free aligned blocks of that order.
    pub unusable_pages: Vec<u64>,
    /// Pageblocks by state and class.
    pub pageblocks: Blocks,
    #[serde(skip)]
    index: Vec<numaframe::UnusableIndex>,
}

/// A zone's pageblocks (Linux's `/proc/pagetypeinfo` "Number of blocks type" row): `free`,
/// `whole`, `long_lived` and `short_lived` add up to all of them; `cached` are the split ones
/// (of either class) lent to a CPU's cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Blocks {
    /// Wholly free.
    pub free: u64,
    /// Handed out whole (2 MiB and larger blocks, huge-page pools included).
    pub whole: u64,
    /// Split, serving long-lived allocations.
    pub long_lived: u64,
    /// Split, serving short-lived allocations.
    pub short_lived: u64,
    /// Of the split ones, lent to a CPU.
    pub cached: u64,
}

fn zones(machine: &Machine<'_>) -> Vec<ZoneReport> {
    let mut out = Vec::new();
    for node in machine.nodes() {
        for kind in ZoneKind::ALL {
            let z = node.zone(kind);
            let c = z.counters();
            if c.managed == 0 {
                continue;
            }
            let index: Vec<_> = Order::all().map(|o| z.unusable_index(o)).collect();
            let b = z.pageblocks();
            out.push(ZoneReport {
                node: node.id().index(),
                zone: zone_name(kind),
                managed_pages: c.managed,
                free_pages: c.free,
                unusable_index: index
                    .iter()
                    .map(|u| u.thousandths() as f64 / 1000.0)
                    .collect(),
                unusable_pages: index.iter().map(|u| u.unusable_pages).collect(),
                pageblocks: Blocks {
                    free: b.free,
                    whole: b.whole,
                    long_lived: b.split[numaframe::Class::Long.index()],
                    short_lived: b.split[numaframe::Class::Short.index()],
                    cached: b.lent,
                },
                index,
            });
        }
    }
    out
}

/// The picture's part of the JSON document.
#[derive(Debug, Serialize)]
struct SvgDoc {
    file: String,
    nodes: Vec<SvgNode>,
}

#[derive(Debug, Serialize)]
struct SvgNode {
    node: usize,
    pageblocks: u64,
    pageblocks_per_square: u64,
    squares: usize,
}

#[derive(Serialize)]
struct Doc<'a> {
    machine: &'a str,
    #[serde(flatten)]
    plan: &'a Plan,
    summary: &'a [NodeSummary],
    zones: &'a [ZoneReport],
    metadata: Metadata,
    svg: Option<SvgDoc>,
}

/// Boots `spec` (one CPU on each node with CPUs), runs `plan`'s workload, draws the picture
/// into `svg` if given and prints the report (or one JSON document).
///
/// # Errors
/// [`CliError::Internal`] if the machine cannot be simulated or booted, the core refuses a
/// free, drawing fails, or writing fails.
pub fn run(
    spec: &MachineSpec,
    plan: &Plan,
    svg: Option<(&PathBuf, File)>,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let sim = Sim::new(spec).map_err(|e| CliError::Internal(format!("simulating: {e}")))?;
    let cpus: Vec<NodeId> = (0..spec.len())
        .filter(|i| !spec.nodes()[*i].cpus.is_empty())
        .map(NodeId::new)
        .collect();
    let machine = sim
        .boot(BootOptions {
            cpus: &cpus,
            ..BootOptions::default()
        })
        .map_err(|e| CliError::Internal(format!("boot: {e}")))?;
    let summary = match (plan.rounds, plan.seed, plan.max_gib) {
        (Some(rounds), Some(seed), Some(max_gib)) => {
            workload::run(&machine, plan.workload, rounds, seed, max_gib)?
        }
        _ => Vec::new(),
    };
    let zones = zones(&machine);
    let metadata = Metadata::of(&machine);
    let svg_doc = match svg {
        Some((path, mut file)) => {
            let maps: Vec<NodeMap> = machine
                .nodes()
                .iter()
                .filter(|n| n.managed_pages() > 0)
                .map(NodeMap::collect)
                .collect();
            // The title holds the machine's name (a file stem): no control characters in XML.
            let caption: String = title(spec, plan)
                .chars()
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect();
            let text = picture::render(&caption, &maps)?;
            file.write_all(text.as_bytes())
                .and_then(|()| file.flush())
                .map_err(|e| CliError::Internal(format!("writing {}: {e}", path.display())))?;
            Some(SvgDoc {
                file: path.display().to_string(),
                nodes: maps
                    .iter()
                    .map(|m| SvgNode {
                        node: m.node,
                        pageblocks: m.pageblocks,
                        pageblocks_per_square: m.per_cell,
                        squares: m.cells(),
                    })
                    .collect(),
            })
        }
        None => None,
    };
    if json {
        let doc = Doc {
            machine: spec.name(),
            plan,
            summary: &summary,
            zones: &zones,
            metadata,
            svg: svg_doc,
        };
        serde_json::to_writer(&mut *out, &doc)?;
        writeln!(out)?;
        return Ok(());
    }
    writeln!(out, "{}", title(spec, plan))?;
    for s in &summary {
        writeln!(out, "  {}", summary_line(plan.workload, s))?;
    }
    writeln!(
        out,
        "\nUnusable free space index, orders 0 to {} (/sys/kernel/debug/extfrag/unusable_index):",
        NR_ORDERS - 1
    )?;
    for z in &zones {
        let values: Vec<String> = z.index.iter().map(ToString::to_string).collect();
        writeln!(
            out,
            "Node {}, zone {:>8} {}",
            z.node,
            z.zone,
            values.join(" ")
        )?;
    }
    let columns = ["Free", "Whole", "Long-lived", "Short-lived", "Cached"];
    let header: Vec<String> = columns.iter().map(|c| format!("{c:>12}")).collect();
    writeln!(
        out,
        "\n{:<23}{}",
        "Number of blocks type ",
        header.join(" ")
    )?;
    for z in &zones {
        let b = &z.pageblocks;
        let row: Vec<String> = [b.free, b.whole, b.long_lived, b.short_lived, b.cached]
            .iter()
            .map(|n| format!("{n:>12}"))
            .collect();
        writeln!(out, "Node {}, zone {:>8} {}", z.node, z.zone, row.join(" "))?;
    }
    writeln!(out, "\nMetadata: {metadata}")?;
    if let Some(s) = &svg_doc {
        let squares: usize = s.nodes.iter().map(|n| n.squares).sum();
        writeln!(out, "Picture: {} ({squares} squares)", s.file)?;
    }
    Ok(())
}

/// The first line of the text and the picture's title.
fn title(spec: &MachineSpec, plan: &Plan) -> String {
    let machine = format!(
        "numaframe frag: machine {}, {} nodes, {:.2} GiB",
        spec.name(),
        spec.len(),
        spec.total_memory_bytes() as f64 / GIB as f64
    );
    match (plan.rounds, plan.seed, plan.max_gib) {
        (Some(r), Some(seed), Some(g)) => format!(
            "{machine}; workload {}, {r} {}, seed {seed}, at most {g} GiB of each node",
            name(plan.workload),
            if plan.workload == Workload::Guests {
                "days"
            } else {
                "rounds"
            }
        ),
        _ => format!("{machine}; as booted"),
    }
}

fn name(w: Workload) -> &'static str {
    match w {
        Workload::None => "none",
        Workload::Churn => "churn",
        Workload::Guests => "guests",
    }
}

fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        100.0 * part as f64 / whole as f64
    }
}

/// One node's line of the workload summary.
fn summary_line(w: Workload, s: &NodeSummary) -> String {
    let head = format!("node {}: {} frames of budget", s.node, s.budget_pages);
    match w {
        Workload::Guests => {
            let guest = s.guest_pages_1g + s.guest_pages_2m + s.guest_pages_4k;
            format!(
                "{head}; guests {} created, {} torn down, {} alive with {guest} frames: {:.1}% in 1 GiB frames, {:.1}% in 2 MiB, {:.1}% in 4 KiB; host {} frames, I/O buffers {}; fallbacks {} from 1 GiB, {} from 2 MiB; {} failed",
                s.guests_created,
                s.guests_torn_down,
                s.guests_alive,
                percent(s.guest_pages_1g, guest),
                percent(s.guest_pages_2m, guest),
                percent(s.guest_pages_4k, guest),
                s.host_pages,
                s.io_pages,
                s.fallbacks_1g,
                s.fallbacks_2m,
                s.failed_allocations
            )
        }
        _ => format!(
            "{head}; filled {}, {} held at the end; {} failed",
            s.filled_pages, s.held_pages, s.failed_allocations
        ),
    }
}
