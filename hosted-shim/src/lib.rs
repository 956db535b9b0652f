//! numaframe-hosted: runs the numaframe core on Linux.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]
#![warn(missing_docs, missing_debug_implementations)]

pub mod bench;
pub mod cli;
pub mod demo;
pub mod hugepages;
pub mod interleave;
pub mod model;
pub mod presets;
pub mod readers;
pub mod sim;
pub mod spec;
