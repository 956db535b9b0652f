//! The `numaframe` command line (the contract is `DESIGN.md`, "Hosted CLI contract").
//!
//! Exit status: 0 success, 2 bad input with exactly one `error: …` line on stderr, 1 internal
//! failure (`error: internal: …`). Arguments are parsed by hand: each command declares the
//! options it takes in a table (`Opt` rows), `Parsed::parse` checks the arguments against it,
//! and the command is a plain function. A new command (interleave, hugepages, bench) is one
//! more row in `COMMANDS` and one more `cmd_*` function; `Parsed::machine` resolves the
//! topology source for any command that lists the `TOPOLOGY` row.
//!
//! Nothing here panics on input. As a last line of defence, [`main`] still catches a panic and
//! turns it into an exit-1 `error: internal: …` line instead of Rust's multi-line report.
#![deny(unsafe_code)]

use std::ffi::OsString;
use std::fmt;
use std::io::{self, Write};
use std::panic::{self, AssertUnwindSafe};
use std::path::Path;
use std::sync::Mutex;

use numaframe::zonelist::FallbackOptions;
use serde::Serialize;

use crate::presets::{PRESETS, preset};
use crate::readers::{DEFAULT_SYSFS_DIR, read_numactl_file, read_sysfs, read_toml_file};
use crate::spec::{MachineSpec, SpecError};

/// Exit status of a successful run.
pub const EXIT_OK: i32 = 0;
/// Exit status of an internal failure.
pub const EXIT_INTERNAL: i32 = 1;
/// Exit status of bad input (arguments or files).
pub const EXIT_BAD_INPUT: i32 = 2;

/// Why a command failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CliError {
    /// The user's arguments or input files are wrong (exit 2).
    BadInput(String),
    /// Something failed that the user could not have caused (exit 1).
    Internal(String),
}

impl CliError {
    /// The exit status this error maps to: [`EXIT_BAD_INPUT`] or [`EXIT_INTERNAL`].
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::BadInput(_) => EXIT_BAD_INPUT,
            CliError::Internal(_) => EXIT_INTERNAL,
        }
    }
}

impl fmt::Display for CliError {
    /// The text after `error: `: the message, prefixed `internal: ` for internal failures.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CliError::BadInput(m) => f.write_str(m),
            CliError::Internal(m) => write!(f, "internal: {m}"),
        }
    }
}

impl std::error::Error for CliError {}

impl From<SpecError> for CliError {
    fn from(e: SpecError) -> Self {
        CliError::BadInput(e.to_string())
    }
}

impl From<io::Error> for CliError {
    /// Writing the output failed (a closed pipe, a full disk): internal.
    fn from(e: io::Error) -> Self {
        CliError::Internal(format!("writing output: {e}"))
    }
}

impl From<serde_json::Error> for CliError {
    /// Serialising or writing JSON output failed: internal.
    fn from(e: serde_json::Error) -> Self {
        CliError::Internal(format!("writing JSON: {e}"))
    }
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

/// Runs `args` (without the program name), writing the output to `out` and at most one
/// `error: …` line to `err`; returns the exit status. A panic becomes an internal error.
pub fn run_to_exit_code(args: &[OsString], out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    let result = panic::catch_unwind(AssertUnwindSafe(|| {
        run(args, out)?;
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

/// Runs one command line (without the program name), writing the output to `out`.
///
/// # Errors
/// [`CliError::BadInput`] for wrong arguments or input files, [`CliError::Internal`] when
/// writing the output fails or the core fails.
pub fn run(args: &[OsString], out: &mut dyn Write) -> Result<(), CliError> {
    let mut args: Vec<String> = args
        .iter()
        .enumerate()
        .map(|(i, a)| {
            a.to_str()
                .map(str::to_string)
                .ok_or_else(|| CliError::BadInput(format!("argument {} is not valid UTF-8", i + 1)))
        })
        .collect::<Result<_, _>>()?;
    // Global options may come before the command; they are handed to it.
    let mut globals = Vec::new();
    while let Some(first) = args.first() {
        match first.as_str() {
            "--json" => globals.push(args.remove(0)),
            "--help" | "-h" => return write_usage(out),
            _ => break,
        }
    }
    let Some(name) = args.first().cloned() else {
        return Err(CliError::BadInput(
            "no command given (try `numaframe help`)".to_string(),
        ));
    };
    if name.starts_with('-') {
        return Err(CliError::BadInput(format!(
            "unknown option `{}` before the command (try `numaframe help`)",
            crate::spec::shorten(&name)
        )));
    }
    let Some(command) = COMMANDS.iter().find(|c| c.name == name) else {
        return Err(CliError::BadInput(format!(
            "unknown command `{}` (try `numaframe help`)",
            crate::spec::shorten(&name)
        )));
    };
    let mut rest: Vec<String> = args.split_off(1);
    rest.extend(globals);
    let parsed = Parsed::parse(command, &rest)?;
    if parsed.help {
        return write_command_usage(command, out);
    }
    (command.run)(&parsed, out)
}

/// One command: its name, its options and the function that runs it.
struct Command {
    name: &'static str,
    /// The usage line after `numaframe `.
    usage: &'static str,
    /// One line saying what it does.
    about: &'static str,
    opts: &'static [Opt],
    run: fn(&Parsed, &mut dyn Write) -> Result<(), CliError>,
}

const COMMANDS: &[Command] = &[
    Command {
        name: "zonelists",
        usage: "zonelists <topology> [--linux-boot-order] [--json]",
        about: "print every node's fallback order as Linux's boot log does",
        opts: &[TOPOLOGY, BOOT_ORDER, JSON],
        run: cmd_zonelists,
    },
    Command {
        name: "demo",
        usage: "demo [--preset NAME] [--json]",
        about: "boot a simulated machine (default cxl-2socket), run the policies, print where frames landed",
        opts: &[
            Opt {
                name: "--preset",
                arity: Arity::Value("NAME"),
            },
            JSON,
        ],
        run: cmd_demo,
    },
    Command {
        name: "interleave",
        usage: "interleave <topology> --weights W,W,...|auto [--nodes LIST] [--state NODE:LEFT] [--cpu-node N] [--socket-aware] --pages N[,N...] [--json] [--model]",
        about: "one task's weighted-interleave bulk allocations: pages per node, node calls, state; or the placement model",
        opts: &[
            TOPOLOGY,
            Opt {
                name: "--weights",
                arity: Arity::Value("W,W,...|auto"),
            },
            Opt {
                name: "--nodes",
                arity: Arity::Value("LIST"),
            },
            Opt {
                name: "--state",
                arity: Arity::Value("NODE:LEFT"),
            },
            Opt {
                name: "--cpu-node",
                arity: Arity::Value("N"),
            },
            Opt {
                name: "--socket-aware",
                arity: Arity::Flag,
            },
            Opt {
                name: "--pages",
                arity: Arity::Value("N[,N...]"),
            },
            Opt {
                name: "--model",
                arity: Arity::Flag,
            },
            JSON,
        ],
        run: cmd_interleave,
    },
    Command {
        name: "hugepages",
        usage: "hugepages <topology> --cmdline \"hugepagesz=1G hugepages=0:4,1:4\" [--threads T] [--json]",
        about: "reserve huge-page pools at boot from a Linux command line, with parallel per-node jobs",
        opts: &[
            TOPOLOGY,
            Opt {
                name: "--cmdline",
                arity: Arity::Value("TEXT"),
            },
            Opt {
                name: "--threads",
                arity: Arity::Value("T"),
            },
            JSON,
        ],
        run: cmd_hugepages,
    },
    Command {
        name: "bench",
        usage: "bench [--json] [--quick]",
        about: "numaframe side by side with buddy_system_allocator, bitmap-allocator, free-list and a Vec floor",
        opts: &[
            Opt {
                name: "--quick",
                arity: Arity::Flag,
            },
            JSON,
        ],
        run: cmd_bench,
    },
    Command {
        name: "help",
        usage: "help [COMMAND]",
        about: "show this text, or one command's usage",
        opts: &[JSON],
        run: cmd_help,
    },
];

/// How an option takes a value.
#[derive(Clone, Copy, Debug)]
enum Arity {
    /// `--json`.
    Flag,
    /// `--preset NAME` or `--preset=NAME`; the string names the value in messages.
    Value(&'static str),
    /// `--sysfs [DIR]`: the next argument is the value unless it starts with `-`.
    OptionalValue(&'static str),
}

/// One option a command accepts.
#[derive(Clone, Copy, Debug)]
struct Opt {
    name: &'static str,
    arity: Arity,
}

const JSON: Opt = Opt {
    name: "--json",
    arity: Arity::Flag,
};
const BOOT_ORDER: Opt = Opt {
    name: "--linux-boot-order",
    arity: Arity::Flag,
};
/// Marker row: the command takes one topology source (all of [`TOPOLOGY_SOURCES`]).
const TOPOLOGY: Opt = Opt {
    name: "<topology>",
    arity: Arity::Flag,
};
const TOPOLOGY_SOURCES: [Opt; 4] = [
    Opt {
        name: "--topology",
        arity: Arity::Value("FILE.toml"),
    },
    Opt {
        name: "--numactl",
        arity: Arity::Value("FILE"),
    },
    Opt {
        name: "--sysfs",
        arity: Arity::OptionalValue("DIR"),
    },
    Opt {
        name: "--preset",
        arity: Arity::Value("NAME"),
    },
];

/// A command's arguments, checked against its options.
#[derive(Debug)]
struct Parsed {
    command: &'static str,
    /// Options given, in order, with their values (`None` for flags and omitted optional values).
    given: Vec<(&'static str, Option<String>)>,
    /// Positional arguments (only `help` takes one).
    positional: Vec<String>,
    help: bool,
}

impl Parsed {
    fn parse(command: &Command, args: &[String]) -> Result<Parsed, CliError> {
        let accepts = |name: &str| -> Option<Opt> {
            command
                .opts
                .iter()
                .flat_map(|o| {
                    if o.name == TOPOLOGY.name {
                        &TOPOLOGY_SOURCES[..]
                    } else {
                        std::slice::from_ref(o)
                    }
                })
                .find(|o| o.name == name)
                .copied()
        };
        let mut p = Parsed {
            command: command.name,
            given: Vec::new(),
            positional: Vec::new(),
            help: false,
        };
        let mut i = 0;
        while i < args.len() {
            let arg = &args[i];
            i += 1;
            if arg == "--help" || arg == "-h" {
                p.help = true;
                continue;
            }
            if !arg.starts_with('-') || arg == "-" {
                if command.name == "help" && p.positional.is_empty() {
                    p.positional.push(arg.clone());
                    continue;
                }
                return Err(p.bad(format!(
                    "unexpected argument `{}`",
                    crate::spec::shorten(arg)
                )));
            }
            let (name, inline) = match arg.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (arg.as_str(), None),
            };
            let Some(opt) = accepts(name) else {
                return Err(p.bad(format!("unknown option `{}`", crate::spec::shorten(name))));
            };
            if p.has(opt.name) {
                return Err(p.bad(format!("`{}` given twice", opt.name)));
            }
            let next_is_value = args.get(i).is_some_and(|a| !a.starts_with('-'));
            let value = match (opt.arity, inline) {
                (Arity::Flag, None) => None,
                (Arity::Flag, Some(_)) => {
                    return Err(p.bad(format!("`{}` takes no value", opt.name)));
                }
                (Arity::Value(_) | Arity::OptionalValue(_), Some(v)) => Some(v),
                (Arity::Value(_) | Arity::OptionalValue(_), None) if next_is_value => {
                    i += 1;
                    Some(args[i - 1].clone())
                }
                (Arity::Value(what), None) => {
                    return Err(p.bad(format!("`{}` needs a value ({what})", opt.name)));
                }
                (Arity::OptionalValue(_), None) => None,
            };
            if let (Arity::Value(what) | Arity::OptionalValue(what), Some("")) =
                (opt.arity, value.as_deref())
            {
                return Err(p.bad(format!("`{}` needs a non-empty value ({what})", opt.name)));
            }
            p.given.push((opt.name, value));
        }
        Ok(p)
    }

    /// A bad-input error about this command's arguments.
    fn bad(&self, message: String) -> CliError {
        CliError::BadInput(format!("{message} (see `numaframe help {}`)", self.command))
    }
    fn has(&self, name: &str) -> bool {
        self.given.iter().any(|(n, _)| *n == name)
    }
    fn flag(&self, name: &str) -> bool {
        self.has(name)
    }
    fn value(&self, name: &str) -> Option<&str> {
        self.given
            .iter()
            .find(|(n, _)| *n == name)
            .and_then(|(_, v)| v.as_deref())
    }

    /// The machine named by the one topology source given.
    fn machine(&self) -> Result<MachineSpec, CliError> {
        let sources: Vec<&str> = self
            .given
            .iter()
            .map(|(n, _)| *n)
            .filter(|n| TOPOLOGY_SOURCES.iter().any(|o| o.name == *n))
            .collect();
        match sources[..] {
            [] => Err(self.bad("no topology given: use one of --topology FILE.toml, --numactl FILE, --sysfs [DIR], --preset NAME".to_string())),
            [one] => self.load(one),
            [a, b, ..] => Err(self.bad(format!("give one topology source, not both `{a}` and `{b}`"))),
        }
    }

    fn load(&self, source: &str) -> Result<MachineSpec, CliError> {
        let value = self.value(source);
        let spec = match (source, value) {
            ("--topology", Some(file)) => read_toml_file(Path::new(file))?,
            ("--numactl", Some(file)) => read_numactl_file(Path::new(file))?,
            ("--sysfs", dir) => read_sysfs(Path::new(dir.unwrap_or(DEFAULT_SYSFS_DIR)))?,
            ("--preset", Some(name)) => load_preset(name)?,
            _ => {
                return Err(CliError::Internal(format!(
                    "topology source `{source}` without a value"
                )));
            }
        };
        Ok(spec)
    }
}

/// The preset `name`, or a bad-input error listing the presets.
fn load_preset(name: &str) -> Result<MachineSpec, CliError> {
    preset(name).ok_or_else(|| {
        CliError::BadInput(format!(
            "unknown preset `{}` (presets: {})",
            crate::spec::shorten(name),
            PRESETS.join(", ")
        ))
    })
}

/// `numaframe zonelists`.
fn cmd_zonelists(args: &Parsed, out: &mut dyn Write) -> Result<(), CliError> {
    let spec = args.machine()?;
    let opts = FallbackOptions {
        linux_boot_order: args.flag(BOOT_ORDER.name),
    };
    let json = args.flag(JSON.name);
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

/// `numaframe demo`.
fn cmd_demo(args: &Parsed, out: &mut dyn Write) -> Result<(), CliError> {
    let spec = load_preset(args.value("--preset").unwrap_or("cxl-2socket"))?;
    crate::demo::run(&spec, args.flag(JSON.name), out)
}

/// `numaframe interleave`.
fn cmd_interleave(args: &Parsed, out: &mut dyn Write) -> Result<(), CliError> {
    let spec = args.machine()?;
    let opts = crate::interleave::Args {
        weights: args.value("--weights"),
        nodes: args.value("--nodes"),
        state: args.value("--state"),
        cpu_node: args.value("--cpu-node"),
        socket_aware: args.flag("--socket-aware"),
        pages: args.value("--pages"),
        json: args.flag(JSON.name),
        model: args.flag("--model"),
    };
    crate::interleave::run(&spec, &opts, out).map_err(|e| match e {
        CliError::BadInput(m) => args.bad(m),
        e => e,
    })
}

/// `numaframe hugepages`.
fn cmd_hugepages(args: &Parsed, out: &mut dyn Write) -> Result<(), CliError> {
    let spec = args.machine()?;
    let cmdline = args
        .value("--cmdline")
        .ok_or_else(|| args.bad("--cmdline is required".to_string()))?;
    let threads = match args.value("--threads") {
        None => crate::hugepages::default_threads(),
        Some(t) => match t.parse::<usize>() {
            Ok(n) if (1..=1024).contains(&n) => n,
            _ => {
                return Err(args.bad(format!(
                    "--threads: expected a number of threads 1..=1024, got `{}`",
                    crate::spec::shorten(t)
                )));
            }
        },
    };
    crate::hugepages::run(&spec, cmdline, threads, args.flag(JSON.name), out).map_err(|e| match e {
        CliError::BadInput(m) => args.bad(m),
        e => e,
    })
}

/// `numaframe bench`.
fn cmd_bench(args: &Parsed, out: &mut dyn Write) -> Result<(), CliError> {
    crate::bench::run_cli(args.flag("--quick"), args.flag(JSON.name), out)
        .map_err(|e| CliError::Internal(format!("bench: {e}")))
}

/// `numaframe help [COMMAND]`.
fn cmd_help(args: &Parsed, out: &mut dyn Write) -> Result<(), CliError> {
    match args.positional.first() {
        None => write_usage(out),
        Some(name) => match COMMANDS.iter().find(|c| c.name == name) {
            Some(command) => write_command_usage(command, out),
            None => Err(CliError::BadInput(format!(
                "unknown command `{}` (try `numaframe help`)",
                crate::spec::shorten(name)
            ))),
        },
    }
}

const TOPOLOGY_HELP: &str = "\
topology (exactly one):
  --topology FILE.toml   a TOML machine description (see DESIGN.md)
  --numactl FILE         saved `numactl --hardware` output
  --sysfs [DIR]          a Linux node directory (default /sys/devices/system/node)
  --preset NAME          a built-in machine";

fn write_usage(out: &mut dyn Write) -> Result<(), CliError> {
    writeln!(
        out,
        "numaframe: the numaframe NUMA page-frame allocator on simulated or real topologies\n"
    )?;
    writeln!(out, "usage: numaframe <command> [options]\n\ncommands:")?;
    for c in COMMANDS {
        writeln!(out, "  {:<52} {}", c.usage, c.about)?;
    }
    writeln!(
        out,
        "\n{TOPOLOGY_HELP}\n  presets: {}\n",
        PRESETS.join(", ")
    )?;
    writeln!(out, "--json prints one JSON document instead of text.")?;
    writeln!(
        out,
        "exit status: 0 success, 2 bad input (one `error:` line on stderr), 1 internal failure"
    )?;
    Ok(())
}

/// Longer help for commands whose options need explaining, printed after the usage line.
const DETAILS: &[(&str, &str)] = &[("interleave", crate::interleave::HELP)];

fn write_command_usage(c: &Command, out: &mut dyn Write) -> Result<(), CliError> {
    writeln!(out, "usage: numaframe {}\n\n{}", c.usage, c.about)?;
    if let Some((_, details)) = DETAILS.iter().find(|(name, _)| *name == c.name) {
        writeln!(out, "\n{details}")?;
    }
    if c.opts.iter().any(|o| o.name == TOPOLOGY.name) {
        writeln!(out, "\n{TOPOLOGY_HELP}\n  presets: {}", PRESETS.join(", "))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
        bad(
            &["--verbose", "zonelists"],
            "unknown option `--verbose` before the command",
        );
        bad(&["zonelists"], "no topology given");
        bad(
            &["zonelists", "--preset"],
            "`--preset` needs a value (NAME)",
        );
        bad(&["zonelists", "--preset="], "needs a non-empty value");
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
    }

    #[test]
    fn help() {
        for args in [&["help"][..], &["--help"], &["-h"], &["help", "--json"]] {
            let (code, out, err) = run_args(args);
            assert_eq!(code, 0, "{args:?}");
            assert!(err.is_empty());
            assert!(
                out.contains("zonelists <topology>") && out.contains("amd-4node"),
                "{out}"
            );
        }
        let (code, out, _) = run_args(&["zonelists", "--help"]);
        assert_eq!(code, 0);
        assert!(
            out.starts_with("usage: numaframe zonelists") && out.contains("--sysfs [DIR]"),
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
    fn errors_map_to_exit_codes() {
        assert_eq!(CliError::BadInput("x".into()).exit_code(), 2);
        assert_eq!(CliError::Internal("x".into()).to_string(), "internal: x");
        let io: CliError = io::Error::other("pipe").into();
        assert_eq!(io.exit_code(), 1);
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
