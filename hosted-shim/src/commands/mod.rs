//! The `numaframe` commands, one module each: its options (`Args`, parsed by clap in
//! [`crate::cli`]) and its entry point `command(args, json, out)`.
#![deny(unsafe_code)]

pub mod bench;
pub mod demo;
mod demo_report;
pub mod frag;
pub mod hugepages;
pub mod interleave;
pub mod metadata;
pub mod source;
pub mod zonelists;
