//! A clap parse error as the contract's one `error:` line: what was wrong, in the words the
//! other bad-input messages use (`unknown option `--frob``, `` `--preset` needs a value
//! (NAME)``), then where to read more (`see `numaframe help COMMAND``). Clap's own usage
//! block is left out, so stderr holds exactly one line.
#![deny(unsafe_code)]

use clap::CommandFactory;
use clap::error::{ContextKind, ContextValue, Error, ErrorKind};

use super::Cli;
use crate::error::CliError;
use crate::spec::shorten;

/// The bad-input error for clap's `e`, raised while parsing `args` (without the program name).
pub(super) fn to_cli_error(e: &Error, args: &[String]) -> CliError {
    let command = command_of(args);
    let text = |k: ContextKind| match e.get(k) {
        Some(ContextValue::String(s)) => Some(s.as_str()),
        Some(ContextValue::Strings(v)) => v.first().map(String::as_str),
        _ => None,
    };
    // "--preset <NAME>" -> ("--preset", "NAME").
    let arg = text(ContextKind::InvalidArg).unwrap_or_default();
    let (name, placeholder) = match arg.split_once(' ') {
        Some((n, p)) => (n, value_name(p)),
        None => (arg, ""),
    };
    let value = text(ContextKind::InvalidValue).unwrap_or_default();
    let message = match e.kind() {
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand | ErrorKind::MissingSubcommand => {
            "no command given".to_string()
        }
        ErrorKind::InvalidSubcommand => {
            let what = text(ContextKind::InvalidSubcommand).unwrap_or_default();
            if what.starts_with('-') {
                format!("unknown option `{}`", shorten(what))
            } else {
                format!("unknown command `{}`", shorten(what))
            }
        }
        ErrorKind::UnknownArgument => match value_option_before(arg, args, command) {
            Some((option, placeholder)) => format!("`{option}` needs a value ({placeholder})"),
            None if arg.starts_with('-') && arg.len() > 1 => {
                format!("unknown option `{}`", shorten(arg))
            }
            None => format!("unexpected argument `{}`", shorten(arg)),
        },
        ErrorKind::InvalidValue if value.is_empty() => {
            format!("`{name}` needs a value ({placeholder})")
        }
        ErrorKind::InvalidValue => match e.get(ContextKind::ValidValue) {
            Some(ContextValue::Strings(valid)) => format!(
                "`{name}`: `{}` is not one of {}",
                shorten(value),
                valid.join(", ")
            ),
            _ => format!("`{name}`: invalid value `{}`", shorten(value)),
        },
        ErrorKind::ValueValidation => match std::error::Error::source(e) {
            Some(why) => format!("`{name}`: invalid value `{}`: {why}", shorten(value)),
            None => format!("`{name}`: invalid value `{}`", shorten(value)),
        },
        ErrorKind::TooManyValues if placeholder.is_empty() => format!("`{name}` takes no value"),
        ErrorKind::TooManyValues => {
            format!("`{name}`: unexpected value `{}`", shorten(value))
        }
        ErrorKind::ArgumentConflict => {
            let prior = text(ContextKind::PriorArg).unwrap_or_default();
            let prior = prior.split(' ').next().unwrap_or_default();
            if prior == name {
                format!("`{name}` given twice")
            } else if [name, prior].iter().all(|a| TOPOLOGY_SOURCES.contains(a)) {
                format!("give one topology source, not both `{name}` and `{prior}`")
            } else {
                format!("`{name}` cannot be used with `{prior}`")
            }
        }
        // Kinds this command line cannot produce today: clap's own words, first line only.
        _ => e
            .render()
            .to_string()
            .lines()
            .next()
            .unwrap_or_default()
            .trim_start_matches("error: ")
            .to_string(),
    };
    let command = command.filter(|_| e.kind() != ErrorKind::InvalidSubcommand);
    with_hint(&message, command)
}

/// The bad-input error `message`, with where to read more: the help of `command`, or the list
/// of commands.
fn with_hint(message: &str, command: Option<&str>) -> CliError {
    let hint = match command {
        Some(c) => format!("see `numaframe help {c}`"),
        None => "try `numaframe help`".to_string(),
    };
    CliError::BadInput(format!("{message} ({hint})"))
}

/// `NAME` of clap's `<NAME>` or `[<NAME>]`.
fn value_name(placeholder: &str) -> &str {
    let p = placeholder.strip_prefix('[').unwrap_or(placeholder);
    let p = p
        .strip_suffix(']')
        .filter(|_| p.len() < placeholder.len())
        .unwrap_or(p);
    p.strip_prefix('<')
        .and_then(|p| p.strip_suffix('>'))
        .unwrap_or(p)
}

/// The options of every command's topology source.
const TOPOLOGY_SOURCES: [&str; 4] = ["--topology", "--numactl", "--sysfs", "--preset"];

/// The command the arguments name: the first argument that is not an option, if it is one of
/// [`Cli`]'s commands.
/// The bad-input error for a lone `-` among `args`, which clap takes as a value (the usual
/// name of standard input) though a separate value may not start with `-`: `` `--svg` needs a
/// value (FILE)`` after an option that takes one, else an unexpected argument.
pub(super) fn lone_dash(args: &[String]) -> Option<CliError> {
    if !args.iter().any(|a| a == "-") {
        return None;
    }
    let command = command_of(args);
    let message = match value_option_before("-", args, command) {
        Some((option, placeholder)) => format!("`{option}` needs a value ({placeholder})"),
        None => "unexpected argument `-`".to_string(),
    };
    Some(with_hint(&message, command))
}

/// The bad-input error for `--json` given twice among `args` (before `--`): clap's global
/// option is not caught twice when one comes before the command and one after it.
pub(super) fn json_twice(args: &[String]) -> Option<CliError> {
    let count = args
        .iter()
        .take_while(|a| *a != "--")
        .filter(|a| *a == "--json")
        .count();
    (count > 1).then(|| with_hint("`--json` given twice", command_of(args)))
}

fn command_of(args: &[String]) -> Option<&str> {
    let first = args.iter().find(|a| !a.starts_with('-'))?;
    (first != "help" && Cli::command().find_subcommand(first).is_some()).then_some(first.as_str())
}

/// If `unknown` directly follows an option of `command` that takes a value (given without
/// `=`), that option and its value name: clap took the value for an option because it starts
/// with `-` (`--pages -4`).
fn value_option_before(
    unknown: &str,
    args: &[String],
    command: Option<&str>,
) -> Option<(String, String)> {
    let at = args.iter().position(|a| a == unknown)?;
    let before = args.get(at.checked_sub(1)?)?;
    let long = before.strip_prefix("--").filter(|l| !l.contains('='))?;
    let cli = Cli::command();
    let sub = cli.find_subcommand(command?)?;
    let opt = sub.get_arguments().find(|a| a.get_long() == Some(long))?;
    if !opt.get_action().takes_values() || opt.get_num_args().is_some_and(|n| n.min_values() == 0) {
        return None;
    }
    let placeholder = opt
        .get_value_names()
        .and_then(|v| v.first())
        .map_or_else(|| "a value".to_string(), ToString::to_string);
    Some((before.clone(), placeholder))
}
