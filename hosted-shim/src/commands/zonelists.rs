//! `numaframe zonelists`: every node's fallback order as Linux's boot log prints it
//! (`Fallback order for Node 0: 0 1 2 3`), or as JSON
//! `{"nodes":[{"node":0,"fallback":[0,1,2,3]},…]}`.
#![deny(unsafe_code)]

use std::io::Write;

use numaframe::zonelist::FallbackOptions;
use serde::Serialize;

use super::source::Source;
use crate::error::CliError;

/// The options of `numaframe zonelists`.
#[derive(clap::Args, Clone, Debug, Default)]
#[command(override_usage = "numaframe zonelists <topology> [--linux-boot-order] [--json]")]
pub struct Args {
    /// The order Linux prints at boot, built before CPUs are known (no CPU penalty)
    #[arg(long)]
    pub linux_boot_order: bool,
    /// The machine.
    #[command(flatten, next_help_heading = "Topology (exactly one)")]
    pub source: Source,
}

/// Runs `numaframe zonelists`.
///
/// # Errors
/// [`CliError::BadInput`] for a bad topology, [`CliError::Internal`] if writing fails.
pub fn command(args: &Args, json: bool, out: &mut dyn Write) -> Result<(), CliError> {
    let spec = args.source.machine()?;
    let opts = FallbackOptions {
        linux_boot_order: args.linux_boot_order,
    };
    let ids: Vec<_> = spec.topology().node_ids().collect();
    spec.with_fallback(opts, |table| {
        if json {
            #[derive(Serialize)]
            struct Node {
                node: usize,
                fallback: Vec<usize>,
            }
            #[derive(Serialize)]
            struct Doc {
                nodes: Vec<Node>,
            }
            let nodes = ids
                .iter()
                .map(|&id| Node {
                    node: id.index(),
                    fallback: table.order(id).iter().map(|n| n.index()).collect(),
                })
                .collect();
            serde_json::to_writer(&mut *out, &Doc { nodes })?;
            writeln!(out)?;
        } else {
            for &id in &ids {
                writeln!(out, "{}", table.display(id))?;
            }
        }
        Ok(())
    })
}
