//! Why a `numaframe` command failed, and the exit status each failure maps to (the contract is
//! docs' "Hosted CLI contract": 0 success, 2 bad input, 1 internal failure).
#![deny(unsafe_code)]

use std::fmt;
use std::io;

use crate::spec::SpecError;

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

    /// The same error with `(see `numaframe help COMMAND`)` after a bad-input message, so the
    /// user learns where the command's options are described.
    pub fn for_command(self, command: &str) -> CliError {
        match self {
            CliError::BadInput(m) => {
                CliError::BadInput(format!("{m} (see `numaframe help {command}`)"))
            }
            e => e,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_map_to_exit_codes() {
        assert_eq!(CliError::BadInput("x".into()).exit_code(), 2);
        assert_eq!(CliError::Internal("x".into()).to_string(), "internal: x");
        let io: CliError = io::Error::other("pipe").into();
        assert_eq!(io.exit_code(), 1);
        assert_eq!(
            CliError::BadInput("bad".into()).for_command("demo"),
            CliError::BadInput("bad (see `numaframe help demo`)".into())
        );
        assert_eq!(
            CliError::Internal("x".into()).for_command("demo"),
            CliError::Internal("x".into())
        );
    }
}
