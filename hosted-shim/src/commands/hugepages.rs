//! `numaframe hugepages`: boot-time reservation of huge-page pools on a simulated machine, the
//! core's jobs run on scoped threads, and Linux's boot lines.
//!
//! The core plans the work ([`ReservationPlan`]) as batches of independent jobs; [`reserve`]
//! runs each batch on `threads` threads that pull job indices from one shared
//! [`JobCursor`], and waits for them before asking for the next batch. The result is the same
//! for any number of threads, but for a node asked for more than it holds, which may end a page
//! short (see the core's `hugetlb` module).
#![deny(unsafe_code)]

use std::io::Write;
use std::time::{Duration, Instant};

use numaframe::hugetlb::cmdline::{CmdlineError, HugepageConfig, parse};
use numaframe::hugetlb::{JobCursor, Report, ReservationPlan};
use numaframe::{BootOptions, Machine, NodeId};
use serde::Serialize;

use super::metadata::Metadata;
use super::source::Source;
use crate::error::CliError;
use crate::sim::Sim;
use crate::spec::MachineSpec;

/// The options of `numaframe hugepages`.
#[derive(clap::Args, Clone, Debug, Default)]
#[command(
    override_usage = "numaframe hugepages <topology> --cmdline \"hugepagesz=1G hugepages=0:4,1:4\" [--threads T] [--json]"
)]
pub struct Args {
    /// Linux's huge-page parameters: hugepagesz=, hugepages= (also per node, 0:4,1:4),
    /// default_hugepagesz=
    #[arg(long, value_name = "TEXT",
          value_parser = clap::builder::NonEmptyStringValueParser::new())]
    pub cmdline: Option<String>,
    /// Threads that run the reservation jobs [default: the CPUs this process may use]
    #[arg(long, value_name = "T", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub threads: Option<u16>,
    /// The machine.
    #[command(flatten, next_help_heading = "Topology (exactly one)")]
    pub source: Source,
}

/// Runs `numaframe hugepages`.
///
/// # Errors
/// As [`run`]; [`CliError::BadInput`] also for a bad topology or a missing `--cmdline`.
pub fn command(args: &Args, json: bool, out: &mut dyn Write) -> Result<(), CliError> {
    let spec = args.source.machine()?;
    let cmdline = args
        .cmdline
        .as_deref()
        .ok_or_else(|| CliError::BadInput("--cmdline is required".to_string()))?;
    let threads = args.threads.map_or_else(default_threads, usize::from);
    run(&spec, cmdline, threads, json, out)
}

/// The default `--threads`: the CPUs this process may run on (1 if that is unknown).
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
}

/// Runs every batch of `plan` on `machine` with `threads` threads (at least 1, the caller's
/// own among them; no more than a batch has jobs). Returns how many pages the jobs reserved.
pub fn reserve(plan: &mut ReservationPlan<'_>, machine: &Machine<'_>, threads: usize) -> u64 {
    let mut got = 0;
    while let Some(batch) = plan.next_batch(machine) {
        let cursor = JobCursor::new();
        let helpers = threads.max(1).min(batch.job_count()).saturating_sub(1);
        got += std::thread::scope(|s| {
            let handles: Vec<_> = (0..helpers)
                .map(|_| s.spawn(|| batch.work(machine, &cursor)))
                .collect();
            let mine = batch.work(machine, &cursor);
            // A helper's panic (a bug) goes on up, as if it had happened here.
            mine + handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .sum::<u64>()
        });
    }
    got
}

/// The error for a rejected command line: the parser's `byte N: …` message and the token at
/// that byte.
fn bad_cmdline(cmdline: &str, e: CmdlineError) -> CliError {
    let rest = cmdline.get(e.offset..).unwrap_or_default();
    // A parameter starts after white space; a node-list entry after `=`, `,` or a quote, and
    // ends at the next comma.
    let in_list = cmdline
        .as_bytes()
        .get(e.offset.wrapping_sub(1))
        .is_some_and(|&b| !is_separator(char::from(b)));
    // Inside a quoted value, white space may come before an entry; the parser skips it (as
    // Linux's `sscanf` does) and names the entry's first byte, the blank.
    let rest = if in_list {
        rest.trim_start_matches(is_separator)
    } else {
        rest
    };
    let param = rest.split(is_separator).next();
    let token = match param {
        Some(p) if in_list => p.split(',').next().filter(|t| !t.is_empty()).unwrap_or(p),
        Some(p) => p,
        None => rest,
    };
    CliError::BadInput(format!("--cmdline: {e} ({token:?})"))
}

/// The white space the parser splits a command line at (Linux's `isspace`): Rust's ASCII white
/// space and the vertical tab.
fn is_separator(c: char) -> bool {
    c.is_ascii_whitespace() || c == '\x0b'
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Boots `spec` as a simulated machine, reserves the huge-page pools `cmdline` asks for with
/// `threads` threads, and prints Linux's lines (or, with `json`, one JSON document):
///
/// ```text
/// HugeTLB: allocating 20 of page size 1.00 GiB failed node0.  Only allocated 14 hugepages.
/// HugeTLB: registered 1.00 GiB page size, pre-allocated 14 pages
/// HugeTLB: registered 2.00 MiB page size, pre-allocated 0 pages
/// HugeTLB: allocation took 0.04 ms with 2 threads
/// numaframe: boot took 0.21 ms, boot and allocation 0.25 ms
/// numaframe: metadata after boot 446464 bytes (436.00 KiB), 6.81 KiB per GiB of 64.00 GiB managed
/// numaframe: metadata after the reservation 446464 bytes (436.00 KiB), 6.81 KiB per GiB of 64.00 GiB managed
/// ```
///
/// JSON: `{"pools":[{"size_kib":1048576,"requested":8,"allocated":8,"per_node":{"0":4,"1":4}},…],
/// "threads":T,"elapsed_ms":x,"boot_ms":b,"allocation_ms":a,"log":[lines],
/// "metadata":{"boot":M,"reserved":M}}` with `M` a [`Metadata`], with a pool for each size in
/// the order of the `registered` lines, every node in `per_node`, and `elapsed_ms` the boot
/// and the allocation together.
///
/// # Errors
/// [`CliError::BadInput`] for a command line the parser rejects or that names a node `spec`
/// does not have (`--cmdline: byte N: … ("token")`), or for 0 threads;
/// [`CliError::Internal`] if the machine cannot be simulated or booted, or writing fails.
pub fn run(
    spec: &MachineSpec,
    cmdline: &str,
    threads: usize,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let config: HugepageConfig = parse(cmdline).map_err(|e| bad_cmdline(cmdline, e))?;
    config
        .validate_nodes(spec.len())
        .map_err(|e| bad_cmdline(cmdline, e))?;
    if threads == 0 {
        return Err(CliError::BadInput(
            "--threads: must be at least 1".to_string(),
        ));
    }
    let sim = Sim::new(spec).map_err(|e| CliError::Internal(format!("simulating: {e}")))?;

    let start = Instant::now();
    let machine = sim
        .boot(BootOptions::default())
        .map_err(|e| CliError::Internal(format!("boot: {e}")))?;
    let booted = start.elapsed();
    let meta_boot = Metadata::of(&machine);
    let mut plan = ReservationPlan::new(&config, &machine).map_err(|e| bad_cmdline(cmdline, e))?;
    reserve(&mut plan, &machine, threads);
    let elapsed = start.elapsed();
    let allocation = elapsed.saturating_sub(booted);
    let metadata = Metadata::of(&machine);

    let report = plan.report(&machine);
    let log: Vec<String> = report.lines().map(|l| l.to_string()).collect();
    if json {
        let doc = Doc {
            pools: pools(&report, &machine),
            threads,
            elapsed_ms: ms(elapsed),
            boot_ms: ms(booted),
            allocation_ms: ms(allocation),
            log,
            metadata: Metadatas {
                boot: meta_boot,
                reserved: metadata,
            },
        };
        serde_json::to_writer(&mut *out, &doc)?;
        writeln!(out)?;
        return Ok(());
    }
    for line in &log {
        writeln!(out, "{line}")?;
    }
    writeln!(
        out,
        "HugeTLB: allocation took {:.2} ms with {threads} threads",
        ms(allocation)
    )?;
    writeln!(
        out,
        "numaframe: boot took {:.2} ms, boot and allocation {:.2} ms",
        ms(booted),
        ms(elapsed)
    )?;
    writeln!(out, "numaframe: metadata after boot {meta_boot}")?;
    writeln!(out, "numaframe: metadata after the reservation {metadata}")?;
    Ok(())
}

/// The JSON document, fields in the order the contract in docs/ shows.
#[derive(Serialize)]
struct Doc {
    pools: Vec<Pool>,
    threads: usize,
    elapsed_ms: f64,
    boot_ms: f64,
    allocation_ms: f64,
    log: Vec<String>,
    metadata: Metadatas,
}

/// The allocator's metadata after boot and after the reservation.
#[derive(Serialize)]
struct Metadatas {
    boot: Metadata,
    reserved: Metadata,
}

#[derive(Serialize)]
struct Pool {
    size_kib: u64,
    requested: u64,
    allocated: u64,
    per_node: PerNode,
}

/// Pages per node, as a JSON object with the nodes in numeric order (`"2"` before `"10"`).
struct PerNode(Vec<(NodeId, u64)>);

impl Serialize for PerNode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(node, n)| (node.index().to_string(), n)))
    }
}

/// One entry per size, in the order of the `registered` lines, with every node.
fn pools(report: &Report<'_, '_>, machine: &Machine<'_>) -> Vec<Pool> {
    report
        .sizes()
        .iter()
        .map(|&size| Pool {
            size_kib: size.kib(),
            requested: report.requested(size),
            allocated: report.allocated(size),
            per_node: PerNode(
                machine
                    .topology()
                    .node_ids()
                    .map(|n| (n, machine.huge_counts(n, size).total))
                    .collect(),
            ),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::presets::preset;

    fn text(preset_name: &str, cmdline: &str, threads: usize) -> Result<String, CliError> {
        let spec = preset(preset_name).expect("preset");
        let mut out = Vec::new();
        run(&spec, cmdline, threads, false, &mut out)?;
        Ok(String::from_utf8(out).expect("utf-8"))
    }

    #[test]
    fn text_output() {
        let out = text("amd-4node", "hugepagesz=1G hugepages=0:2,3:1", 2).unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines[..2],
            [
                "HugeTLB: registered 1.00 GiB page size, pre-allocated 3 pages",
                "HugeTLB: registered 2.00 MiB page size, pre-allocated 0 pages",
            ]
        );
        assert!(
            lines[2].starts_with("HugeTLB: allocation took ")
                && lines[2].ends_with(" ms with 2 threads")
        );
        assert!(lines[3].starts_with("numaframe: boot took "));
        assert!(lines[4].starts_with("numaframe: metadata after boot "));
        assert!(lines[5].starts_with("numaframe: metadata after the reservation "));
        assert_eq!(lines.len(), 6);
    }

    #[test]
    fn error_tokens_end_at_every_separator_the_parser_splits_at() {
        // The parser splits at space, \t, \n, \v, \f and \r (Linux's `isspace`); the token
        // is the one bad parameter or node-list entry, whichever of them follows it.
        for sep in [" ", "\t", "\n", "\x0b", "\x0c", "\r"] {
            let e = text("amd-4node", &format!("hugepagesz=3M{sep}quiet"), 1).unwrap_err();
            assert_eq!(
                e,
                CliError::BadInput(
                    "--cmdline: byte 0: unsupported huge page size (\"hugepagesz=3M\")".into()
                ),
                "separator {sep:?}"
            );
            let e = text("amd-4node", &format!("ro{sep}hugepages=0:1,7:2{sep}1:1"), 1).unwrap_err();
            assert_eq!(
                e,
                CliError::BadInput("--cmdline: byte 17: unknown node (\"7:2\")".into()),
                "separator {sep:?}"
            );
        }
    }

    #[test]
    fn error_tokens_name_a_node_list_entry_that_starts_with_white_space() {
        // Inside a quoted value, white space may come before an entry: the parser skips it, as
        // Linux's `sscanf("%lu")` does, and names the entry's first byte, the blank. The token
        // is still that entry, the same as without the blank.
        let plain = text("amd-4node", "hugepages=\"0:1,7:1\"", 1).unwrap_err();
        for blank in [" ", "\t", "\n", "  \t"] {
            let line = format!("hugepages=\"0:1,{blank}7:1\"");
            let e = text("amd-4node", &line, 1).unwrap_err();
            let CliError::BadInput(m) = &e else {
                panic!("{line:?}: {e:?}")
            };
            assert!(
                m.starts_with("--cmdline: byte 15: unknown node (\"7:1"),
                "{line:?}: {m}"
            );
            assert_eq!(e, plain, "{line:?}");
        }
        let e = text("amd-4node", "hugepages=\"0:1, x:1\"", 1).unwrap_err();
        assert!(
            e.to_string()
                .contains("malformed node entry, expected NODE:COUNT (\"x:1"),
            "{e}"
        );
    }

    #[test]
    fn errors_name_the_token() {
        let e = text("amd-4node", "quiet hugepagesz=3M hugepages=1", 1).unwrap_err();
        assert_eq!(
            e,
            CliError::BadInput(
                "--cmdline: byte 6: unsupported huge page size (\"hugepagesz=3M\")".into()
            )
        );
        let e = text("amd-4node", "hugepages=0:1,7:2 quiet", 1).unwrap_err();
        assert_eq!(
            e,
            CliError::BadInput("--cmdline: byte 14: unknown node (\"7:2\")".into())
        );
        let e = text("amd-4node", "hugepages=0:1,,1:1", 1).unwrap_err();
        assert!(matches!(e, CliError::BadInput(m) if m.starts_with("--cmdline: byte 14: ")));
        let e = text("amd-4node", "hugepages=1", 0).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(
            bad_cmdline(
                "",
                CmdlineError {
                    offset: 9,
                    kind: numaframe::hugetlb::cmdline::CmdlineErrorKind::MissingValue
                }
            )
            .to_string()
            .contains("\"\"")
        );
    }
}
