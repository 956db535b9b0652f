//! Links the bare-metal build at QEMU virt's RAM (see `link.ld`); the host build needs nothing.
use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=link.ld");
    println!("cargo:rerun-if-changed=build.rs");
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let os = env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if arch != "aarch64" || os != "none" {
        return;
    }
    let dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    println!(
        "cargo:rustc-link-arg-bins=-T{}",
        dir.join("link.ld").display()
    );
    if env::var_os("CARGO_FEATURE_DEFMT").is_some() {
        // defmt's build script puts `defmt.x` on the link search path.
        println!("cargo:rustc-link-arg-bins=-Tdefmt.x");
    }
}
