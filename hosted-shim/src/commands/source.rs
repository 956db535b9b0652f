//! The topology source a command reads its machine from: exactly one of `--topology`,
//! `--numactl`, `--sysfs [DIR]` and `--preset`. Clap rejects two of them (an argument group);
//! [`Source::machine`] rejects none and reads the one given.
#![deny(unsafe_code)]

use std::path::PathBuf;

use clap::Args;

use crate::error::CliError;
use crate::presets::{PRESETS, preset};
use crate::readers::{DEFAULT_SYSFS_DIR, read_numactl_file, read_sysfs, read_toml_file};
use crate::spec::{MachineSpec, shorten};

/// The topology options (exactly one).
#[derive(Args, Clone, Debug, Default)]
#[group(id = "source", multiple = false)]
pub struct Source {
    /// A TOML machine description (schema: docs/, "Hosted CLI contract")
    #[arg(long, value_name = "FILE.toml")]
    pub topology: Option<PathBuf>,
    /// Saved `numactl --hardware` output
    #[arg(long, value_name = "FILE")]
    pub numactl: Option<PathBuf>,
    /// A Linux node directory [default: /sys/devices/system/node]
    #[arg(long, value_name = "DIR", num_args = 0..=1, default_missing_value = DEFAULT_SYSFS_DIR)]
    pub sysfs: Option<PathBuf>,
    /// A built-in machine
    #[arg(long, value_name = "NAME", long_help = preset_help(),
          value_parser = clap::builder::NonEmptyStringValueParser::new())]
    pub preset: Option<String>,
}

impl Source {
    /// The machine named by the one source given.
    ///
    /// # Errors
    /// [`CliError::BadInput`] if no source is given or the file cannot be read or parsed.
    pub fn machine(&self) -> Result<MachineSpec, CliError> {
        let spec = match (&self.topology, &self.numactl, &self.sysfs, &self.preset) {
            (Some(file), ..) => read_toml_file(file)?,
            (_, Some(file), ..) => read_numactl_file(file)?,
            (_, _, Some(dir), _) => read_sysfs(dir)?,
            (.., Some(name)) => load_preset(name)?,
            (None, None, None, None) => {
                return Err(CliError::BadInput(
                    "no topology given: use one of --topology FILE.toml, --numactl FILE, --sysfs [DIR], --preset NAME".to_string(),
                ));
            }
        };
        Ok(spec)
    }
}

fn preset_help() -> String {
    format!("A built-in machine: {}", PRESETS.join(", "))
}

/// The preset `name`, or a bad-input error listing the presets.
///
/// # Errors
/// [`CliError::BadInput`] for a name that is not a preset.
pub fn load_preset(name: &str) -> Result<MachineSpec, CliError> {
    preset(name).ok_or_else(|| {
        CliError::BadInput(format!(
            "unknown preset `{}` (presets: {})",
            shorten(name),
            PRESETS.join(", ")
        ))
    })
}
