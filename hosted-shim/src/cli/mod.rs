//! The `numaframe` command line (the contract is docs' "Hosted CLI contract").
//!
//! Exit status: 0 success, 2 bad input with an `error: …` line on stderr that names what was
//! wrong, 1 internal failure (`error: internal: …`). Clap parses the arguments into [`Cli`]:
//! every command is a module of [`crate::commands`] with its own options (`Args`) and one
//! entry point; a clap error becomes the same one `error:` line as any other bad input
//! (`parse_error`). Help (`numaframe help`, `--help`, `-h`) is clap's, on stdout, exit 0.
//!
//! Nothing here panics on input. As a last line of defence, [`main`] still catches a panic and
//! turns it into an exit-1 `error: internal: …` line instead of Rust's multi-line report.
#![deny(unsafe_code)]

use std::ffi::OsString;
use std::io::{self, Write};
use std::panic::{self, AssertUnwindSafe};
use std::sync::Mutex;

use clap::error::ErrorKind;
use clap::{Parser, Subcommand};

use crate::commands::{bench, demo, frag, hugepages, interleave, zonelists};
use crate::presets::PRESETS;

mod parse_error;

pub use crate::error::{CliError, EXIT_BAD_INPUT, EXIT_INTERNAL, EXIT_OK};

/// The whole command line.
#[derive(Debug, Parser)]
#[command(
    name = "numaframe",
    about = "numaframe: the numaframe NUMA page-frame allocator on simulated or real topologies",
    after_help = after_help(),
    disable_version_flag = true,
    arg_required_else_help = false
)]
pub struct Cli {
    /// Print one JSON document on stdout instead of the text
    #[arg(long, global = true)]
    pub json: bool,
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands, one module each under [`crate::commands`].
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print every node's fallback order as Linux's boot log does
    Zonelists(zonelists::Args),
    /// Boot a simulated machine (default cxl-2socket), run the policies, print where frames landed
    Demo(demo::Args),
    /// One task's weighted-interleave bulk allocations: pages per node, node calls, state; or the placement model
    Interleave(interleave::Args),
    /// Reserve huge-page pools at boot from a Linux command line, with parallel per-node jobs
    Hugepages(hugepages::Args),
    /// Run a workload, then print fragmentation as Linux does (unusable index, pageblocks) and draw it
    Frag(frag::Args),
    /// numaframe side by side with buddy_system_allocator, bitmap-allocator, free-list, an oracle and a Vec floor
    Bench(bench::Args),
}

impl Command {
    /// The command's name, as typed.
    fn name(&self) -> &'static str {
        match self {
            Command::Zonelists(_) => "zonelists",
            Command::Demo(_) => "demo",
            Command::Interleave(_) => "interleave",
            Command::Hugepages(_) => "hugepages",
            Command::Frag(_) => "frag",
            Command::Bench(_) => "bench",
        }
    }
}

/// The text after the top-level help's option list.
fn after_help() -> String {
    format!(
        "Topology (exactly one, for zonelists, interleave, hugepages and frag):\n  \
         --topology FILE.toml   a TOML machine description\n  \
         --numactl FILE         saved `numactl --hardware` output\n  \
         --sysfs [DIR]          a Linux node directory (default /sys/devices/system/node)\n  \
         --preset NAME          a built-in machine\n  \
         presets: {}\n\n\
         --json prints one JSON document instead of text.\n\
         Exit status: 0 success, 2 bad input (an `error:` line on stderr), 1 internal failure.",
        PRESETS.join(", ")
    )
}

/// The process entry point: runs the command line of this process with stdout and stderr and
/// returns the exit status. `main.rs` passes it to `std::process::exit`.
pub fn main() -> i32 {
    panic::set_hook(Box::new(|info| {
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        let what = panic_message(info.payload());
        if let Ok(mut last) = LAST_PANIC.lock() {
            *last = Some(format!("panicked{at}: {what}"));
        }
    }));
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    let code = run_to_exit_code(&args, &mut out, &mut io::stderr());
    drop(out); // already flushed by `run_to_exit_code`; dropping cannot report anything new
    code
}

/// The message of the last panic, recorded by the hook [`main`] installs.
static LAST_PANIC: Mutex<Option<String>> = Mutex::new(None);

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    match (
        payload.downcast_ref::<&str>(),
        payload.downcast_ref::<String>(),
    ) {
        (Some(s), _) => (*s).to_string(),
        (_, Some(s)) => s.clone(),
        _ => "unknown panic".to_string(),
    }
}

/// Runs `args` (without the program name), writing the output to `out` and progress and at
/// most one `error: …` line to `err`; returns the exit status. A panic becomes an internal
/// error.
pub fn run_to_exit_code(args: &[OsString], out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    let result = panic::catch_unwind(AssertUnwindSafe(|| {
        run_with_progress(args, out, err)?;
        out.flush()?;
        Ok(())
    }));
    let result = result.unwrap_or_else(|payload| {
        let recorded = LAST_PANIC.lock().ok().and_then(|mut p| p.take());
        Err(CliError::Internal(recorded.unwrap_or_else(|| {
            format!("panicked: {}", panic_message(&*payload))
        })))
    });
    match result {
        Ok(()) => EXIT_OK,
        Err(e) => {
            let line: String = e
                .to_string()
                .chars()
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect();
            // If stderr is gone there is nobody left to tell; the exit status still says it.
            let _ = writeln!(err, "error: {line}");
            let _ = err.flush();
            e.exit_code()
        }
    }
}

/// Runs one command line (without the program name), writing the output to `out` and a long
/// command's progress to this process's stderr.
///
/// # Errors
/// As [`run_with_progress`].
pub fn run(args: &[OsString], out: &mut dyn Write) -> Result<(), CliError> {
    run_with_progress(args, out, &mut io::stderr())
}

/// Runs one command line (without the program name), writing the output to `out` and a long
/// command's progress to `progress`.
///
/// # Errors
/// [`CliError::BadInput`] for wrong arguments or input files, [`CliError::Internal`] when
/// writing the output fails or the core fails.
pub fn run_with_progress(
    args: &[OsString],
    out: &mut dyn Write,
    progress: &mut dyn Write,
) -> Result<(), CliError> {
    let args: Vec<String> = args
        .iter()
        .enumerate()
        .map(|(i, a)| {
            a.to_str()
                .map(str::to_string)
                .ok_or_else(|| CliError::BadInput(format!("argument {} is not valid UTF-8", i + 1)))
        })
        .collect::<Result<_, _>>()?;
    if let Some(e) = parse_error::lone_dash(&args) {
        return Err(e);
    }
    if let Some(e) = parse_error::json_twice(&args) {
        return Err(e);
    }
    let cli =
        match Cli::try_parse_from(std::iter::once("numaframe".to_string()).chain(args.clone())) {
            Ok(cli) => cli,
            Err(e) if e.kind() == ErrorKind::DisplayHelp => {
                write!(out, "{}", e.render())?;
                return Ok(());
            }
            Err(e) => return Err(parse_error::to_cli_error(&e, &args)),
        };
    let json = cli.json;
    let name = cli.command.name();
    let result = match &cli.command {
        Command::Zonelists(a) => zonelists::command(a, json, out),
        Command::Demo(a) => demo::command(a, json, out),
        Command::Interleave(a) => interleave::command(a, json, out),
        Command::Hugepages(a) => hugepages::command(a, json, out),
        Command::Frag(a) => frag::command(a, json, out),
        Command::Bench(a) => bench::command(a, json, out, progress),
    };
    result.map_err(|e| e.for_command(name))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use clap::CommandFactory;

    use super::*;
    use crate::readers::DEFAULT_SYSFS_DIR;

    fn run_args(args: &[&str]) -> (i32, String, String) {
        let args: Vec<OsString> = args.iter().map(OsString::from).collect();
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = run_to_exit_code(&args, &mut out, &mut err);
        (
            code,
            String::from_utf8(out).unwrap(),
            String::from_utf8(err).unwrap(),
        )
    }

    fn bad(args: &[&str], want: &str) {
        let (code, out, err) = run_args(args);
        assert_eq!(code, EXIT_BAD_INPUT, "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?}: {out}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err:?}");
        assert!(
            err.starts_with("error: ") && err.contains(want),
            "{args:?}: got {err:?}, want {want:?}"
        );
    }

    #[test]
    fn the_clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn zonelists_text_and_json() {
        let (code, out, _) = run_args(&["zonelists", "--preset", "amd-4node"]);
        assert_eq!(code, 0);
        assert_eq!(
            out,
            "Fallback order for Node 0: 0 1 2 3\nFallback order for Node 1: 1 0 3 2\nFallback order for Node 2: 2 3 0 1\nFallback order for Node 3: 3 2 1 0\n"
        );
        let (code, json, _) = run_args(&["--json", "zonelists", "--preset=amd-4node"]);
        assert_eq!(code, 0);
        assert!(
            json.starts_with(r#"{"nodes":[{"node":0,"fallback":[0,1,2,3]},{"node":1,"#),
            "{json}"
        );
        assert_eq!(
            run_args(&["zonelists", "--json", "--preset", "amd-4node"]).1,
            json
        );
    }

    #[test]
    fn boot_order_flag() {
        let (_, normal, _) = run_args(&["zonelists", "--preset", "cxl-2socket"]);
        let (code, boot, _) =
            run_args(&["zonelists", "--preset", "cxl-2socket", "--linux-boot-order"]);
        assert_eq!(code, 0);
        assert_eq!(normal.lines().count(), 4);
        assert_eq!(boot.lines().count(), 4);
    }

    #[test]
    fn bad_arguments() {
        bad(&[], "no command given");
        bad(&["frobnicate"], "unknown command `frobnicate`");
        bad(&["--verbose", "zonelists"], "unknown option `--verbose`");
        bad(&["zonelists"], "no topology given");
        bad(
            &["zonelists", "--preset"],
            "`--preset` needs a value (NAME)",
        );
        bad(&["zonelists", "--preset="], "`--preset` needs a value");
        bad(
            &["zonelists", "--preset", "--json"],
            "`--preset` needs a value",
        );
        bad(
            &["zonelists", "--preset", "nope"],
            "unknown preset `nope` (presets: amd-4node, ",
        );
        bad(
            &["zonelists", "--preset", "amd-4node", "--preset", "fake-64"],
            "`--preset` given twice",
        );
        bad(
            &["zonelists", "--preset", "amd-4node", "--sysfs"],
            "give one topology source, not both `--preset` and `--sysfs`",
        );
        bad(
            &["zonelists", "--preset", "amd-4node", "--bogus"],
            "unknown option `--bogus` (see `numaframe help zonelists`)",
        );
        bad(
            &["zonelists", "--preset", "amd-4node", "extra"],
            "unexpected argument `extra`",
        );
        bad(
            &["zonelists", "--preset", "amd-4node", "--json=yes"],
            "`--json` takes no value",
        );
        bad(
            &["zonelists", "--topology", "/nonexistent/x.toml"],
            "/nonexistent/x.toml: ",
        );
        bad(
            &["zonelists", "--numactl", "/nonexistent/x.txt"],
            "/nonexistent/x.txt: ",
        );
        bad(
            &["zonelists", "--sysfs", "/nonexistent/node"],
            "/nonexistent/node: ",
        );
        bad(
            &["demo", "--sysfs"],
            "unknown option `--sysfs` (see `numaframe help demo`)",
        );
        bad(
            &["demo", "--preset", "nope\nline"],
            "unknown preset `nope line`",
        );
        bad(&["help", "nope"], "unknown command `nope`");
        bad(
            &[
                "hugepages",
                "--preset",
                "amd-4node",
                "--cmdline",
                "x",
                "--threads",
                "0",
            ],
            "`--threads`: invalid value `0`: 0 is not in 1..=1024",
        );
        bad(
            &[
                "hugepages",
                "--preset",
                "amd-4node",
                "--cmdline",
                "x",
                "--threads",
                "two",
            ],
            "`--threads`: invalid value `two`",
        );
        bad(
            &["interleave", "--preset", "amd-4node", "--pages"],
            "`--pages` needs a value (N[,N...]) (see `numaframe help interleave`)",
        );
        bad(&["zonelists", "--sysfs="], "`--sysfs` needs a value (DIR)");
        bad(
            &["interleave", "--preset", "amd-4node", "--pages", "-4"],
            "`--pages` needs a value (N[,N...])",
        );
    }

    #[test]
    fn help() {
        for args in [&["help"][..], &["--help"], &["-h"]] {
            let (code, out, err) = run_args(args);
            assert_eq!(code, 0, "{args:?}");
            assert!(err.is_empty());
            assert!(
                out.contains("Usage: numaframe")
                    && out.contains("zonelists")
                    && out.contains("amd-4node"),
                "{out}"
            );
        }
        let (code, out, _) = run_args(&["zonelists", "--help"]);
        assert_eq!(code, 0);
        assert!(
            out.contains("Usage: numaframe zonelists") && out.contains("--sysfs [<DIR>]"),
            "{out}"
        );
        assert_eq!(run_args(&["help", "zonelists"]).1, out);
    }

    #[test]
    fn sysfs_default_dir() {
        if Path::new(DEFAULT_SYSFS_DIR).is_dir() {
            let (code, out, err) = run_args(&["zonelists", "--sysfs"]);
            assert_eq!(code, 0, "{err}");
            assert!(out.starts_with("Fallback order for Node 0: 0"), "{out}");
            assert_eq!(run_args(&["zonelists", "--sysfs", "--json"]).0, 0);
        }
    }

    #[test]
    fn write_failure_is_internal() {
        struct Broken;
        impl Write for Broken {
            fn write(&mut self, _: &[u8]) -> io::Result<usize> {
                Err(io::Error::new(io::ErrorKind::BrokenPipe, "closed"))
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let mut err = Vec::new();
        let args = [
            OsString::from("zonelists"),
            OsString::from("--preset"),
            OsString::from("amd-4node"),
        ];
        assert_eq!(
            run_to_exit_code(&args, &mut Broken, &mut err),
            EXIT_INTERNAL
        );
        assert!(
            String::from_utf8(err)
                .unwrap()
                .starts_with("error: internal: writing output: closed")
        );
    }

    #[cfg(unix)]
    #[test]
    fn non_utf8_argument() {
        use std::os::unix::ffi::OsStringExt;
        let args = [OsString::from("zonelists"), OsString::from_vec(vec![0xff])];
        let (mut out, mut err) = (Vec::new(), Vec::new());
        assert_eq!(run_to_exit_code(&args, &mut out, &mut err), EXIT_BAD_INPUT);
        assert_eq!(
            String::from_utf8(err).unwrap(),
            "error: argument 2 is not valid UTF-8\n"
        );
    }
}
