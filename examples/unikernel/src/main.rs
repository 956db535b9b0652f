//! numaframe-unikernel: a bare-metal program for QEMU that takes its NUMA layout from the
//! firmware and runs on numaframe: on aarch64 (`virt`, device tree, every CPU through PSCI) and
//! on x86_64 (PVH boot, ACPI SRAT/SLIT, page tables from numaframe frames).
//!
//! Build and run (see `examples/README.md`):
//!
//! ```text
//! cargo build --release -p numaframe-unikernel --target aarch64-unknown-none
//! qemu-system-aarch64 -M virt -cpu cortex-a57 -nographic -kernel \
//!     target/aarch64-unknown-none/release/numaframe-unikernel
//! cargo build --release -p numaframe-unikernel --target x86_64-unknown-none
//! qemu-system-x86_64 -M q35 -nographic -device isa-debug-exit -kernel \
//!     target/x86_64-unknown-none/release/numaframe-unikernel
//! ```
//!
//! The platforms live in `aarch64` and `x86`, compiled only for `target_os = "none"`; what both
//! kernels do once they know their machine is in `kernel`. For the host (what `cargo test
//! --workspace` and clippy build) the crate is an ordinary program that says so, plus the unit
//! tests of the platform-free modules (`boot`, `smp`, `srat`), which run the same steps over a
//! simulated machine.
#![cfg_attr(target_os = "none", no_std, no_main)]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]

extern crate alloc;

#[cfg_attr(not(target_os = "none"), allow(dead_code))]
mod boot;
#[cfg_attr(not(target_os = "none"), allow(dead_code))]
mod pcp;
#[cfg_attr(not(target_os = "none"), allow(dead_code))]
mod smp;
#[cfg(any(not(target_os = "none"), target_arch = "x86_64"))]
#[cfg_attr(not(target_os = "none"), allow(dead_code))]
mod srat;

#[cfg(target_os = "none")]
mod kernel;

#[cfg(all(target_os = "none", target_arch = "aarch64"))]
mod aarch64;
#[cfg(all(target_os = "none", target_arch = "aarch64"))]
use aarch64 as arch;
#[cfg(all(target_os = "none", target_arch = "aarch64", feature = "defmt"))]
mod log;

#[cfg(all(target_os = "none", target_arch = "x86_64"))]
mod x86;
#[cfg(all(target_os = "none", target_arch = "x86_64"))]
use x86 as arch;

#[cfg(not(target_os = "none"))]
fn main() {
    eprintln!(
        "numaframe-unikernel is a bare-metal program: build it with\n  \
         cargo build --release -p numaframe-unikernel --target aarch64-unknown-none\n\
         (or --target x86_64-unknown-none) and boot it under QEMU (see examples/README.md)"
    );
    std::process::exit(2);
}
