//! numaframe-hosted: runs the numaframe core on Linux.
//!
//! [`sim`] simulates machines over mmap (and [`reporting`] gives reported memory back to Linux,
//! [`kick`] wakes the threads that own idle CPU handles), [`readers`] and [`presets`] describe them ([`spec`]),
//! [`model`] estimates placements' bandwidth, [`bench`](mod@bench) measures numaframe against its peers,
//! and [`cli`] is the `numaframe` command, one module of [`commands`] per subcommand.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]
#![warn(missing_docs, missing_debug_implementations)]

pub mod bench;
pub mod cli;
pub mod commands;
pub mod error;
pub mod kick;
pub mod model;
pub mod presets;
pub mod readers;
pub mod reporting;
pub mod sim;
pub mod spec;

/// The `hugepages` command under its earlier path, for callers outside this crate.
pub use commands::hugepages;
