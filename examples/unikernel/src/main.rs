//! numaframe-unikernel: a bare-metal aarch64 program for QEMU's `virt` machine that takes its
//! NUMA layout from the device tree and runs on numaframe.
//!
//! Build and run (see the README's "Unikernel" section):
//!
//! ```text
//! cargo build --release -p numaframe-unikernel --target aarch64-unknown-none
//! qemu-system-aarch64 -M virt -cpu cortex-a57 -nographic -kernel \
//!     target/aarch64-unknown-none/release/numaframe-unikernel
//! ```
//!
//! The bare-metal program lives in `kernel` and is compiled only for `target_os = "none"`. For
//! the host (what `cargo test --workspace` and clippy build) the crate is an ordinary program
//! that says so, plus the unit tests of `boot`, which runs the same steps over a simulated
//! machine.
#![cfg_attr(target_os = "none", no_std, no_main)]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]

extern crate alloc;

#[cfg_attr(not(target_os = "none"), allow(dead_code))]
mod boot;
#[cfg(target_os = "none")]
mod kernel;
#[cfg(all(target_os = "none", feature = "defmt"))]
mod log;

#[cfg(not(target_os = "none"))]
fn main() {
    eprintln!(
        "numaframe-unikernel is a bare-metal program: build it with\n  \
         cargo build --release -p numaframe-unikernel --target aarch64-unknown-none\n\
         and boot it with qemu-system-aarch64 -M virt -cpu cortex-a57 -nographic -kernel ELF"
    );
    std::process::exit(2);
}
