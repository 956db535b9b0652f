//! Links each bare-metal build with its platform's link script (`link-aarch64.ld` for QEMU
//! virt's RAM, `link-x86_64.ld` for a PVH kernel at 2 MiB); the host build needs nothing.
use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=link-aarch64.ld");
    println!("cargo:rerun-if-changed=link-x86_64.ld");
    println!("cargo:rerun-if-changed=build.rs");
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let os = env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if os != "none" || !matches!(arch.as_str(), "aarch64" | "x86_64") {
        return;
    }
    let dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let script = dir.join(format!("link-{arch}.ld"));
    println!("cargo:rustc-link-arg-bins=-T{}", script.display());
    if arch == "x86_64" {
        // `x86_64-unknown-none` links a static PIE by default, whose relocations nobody would
        // apply: QEMU loads the image at its link address and jumps in.
        println!("cargo:rustc-link-arg-bins=--no-pie");
    }
    if arch == "aarch64" && env::var_os("CARGO_FEATURE_DEFMT").is_some() {
        // defmt's build script puts `defmt.x` on the link search path.
        println!("cargo:rustc-link-arg-bins=-Tdefmt.x");
    }
}
