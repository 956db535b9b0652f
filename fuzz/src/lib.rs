//! Fuzz harnesses for numaframe, shared by the cargo-fuzz targets in `fuzz_targets/` and by the
//! regression replay in `tests/regressions.rs` (which runs on stable, without libFuzzer).
//!
//! Each harness panics on a broken promise; libFuzzer turns the panic into a crash.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_debug_implementations)]

pub mod mem;
pub mod ops;
pub mod parsers;

/// Runs the harness of `target` on `data`; `false` for an unknown target.
pub fn run(target: &str, data: &[u8]) -> bool {
    match target {
        "ops" => ops::run(data),
        "handles" => ops::run_handles(data),
        "topology_toml" => parsers::topology_toml(data),
        "numactl" => parsers::numactl(data),
        "cmdline" => parsers::cmdline(data),
        "fdt" => parsers::fdt(data),
        _ => return false,
    }
    true
}

/// Every target, as named in `Cargo.toml`.
pub const TARGETS: [&str; 6] = [
    "ops",
    "handles",
    "topology_toml",
    "numactl",
    "cmdline",
    "fdt",
];
