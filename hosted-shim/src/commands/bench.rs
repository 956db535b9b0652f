//! `numaframe bench [--quick] [--json]`: the side-by-side benchmark of [`crate::bench`]. The
//! table (or, with `--json`, one JSON document) goes to stdout; a line per scenario as it
//! starts goes to stderr, so a long run shows where it is.
#![deny(unsafe_code)]

use std::io::Write;

use crate::error::CliError;

/// The options of `numaframe bench`.
#[derive(clap::Args, Clone, Debug, Default)]
#[command(override_usage = "numaframe bench [--quick] [--json]")]
pub struct Args {
    /// Small sizes and few samples: every scenario in a few seconds, rough numbers
    #[arg(long)]
    pub quick: bool,
}

/// Runs `numaframe bench`.
///
/// # Errors
/// [`CliError::Internal`] if a benchmark machine cannot be built or writing fails.
pub fn command(
    args: &Args,
    json: bool,
    out: &mut dyn Write,
    progress: &mut dyn Write,
) -> Result<(), CliError> {
    crate::bench::run_cli(args.quick, json, out, progress)
        .map_err(|e| CliError::Internal(format!("bench: {e}")))
}
