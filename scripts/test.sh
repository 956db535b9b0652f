#!/usr/bin/env bash
# The one test command: everything CI checks, from a fresh machine.
#   scripts/test.sh            the full gate (what .ci/run runs)
#   STRESS_OPS=2000000 scripts/test.sh   a longer hosted stress run
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

step "toolchain (from rust-toolchain.toml)"
command -v rustup >/dev/null || { echo "error: rustup is required" >&2; exit 1; }
channel=$(sed -n 's/^channel *= *"\(.*\)"/\1/p' rust-toolchain.toml)
rustup toolchain install "$channel" --profile minimal \
  --component rustfmt,clippy --target x86_64-unknown-none,aarch64-unknown-none >/dev/null
rustc --version

step "fmt"
cargo fmt --all -- --check

step "clippy (all targets, -D warnings)"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "rustdoc (-D warnings)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked --quiet

step "core is no_std: bare-metal builds"
for target in x86_64-unknown-none aarch64-unknown-none; do
  cargo build -p numaframe --locked --no-default-features --target "$target" --quiet
  cargo build -p numaframe --locked --all-features --target "$target" --quiet
done

step "unikernel: QEMU, clippy and the aarch64 and x86_64 ELFs for the QEMU tests"
# tests/tests/qemu.rs and fdt.rs boot QEMU's aarch64 `virt` machine and its x86_64 `q35` machine;
# they fail (not skip) without them. Debian's qemu-system-arm provides qemu-system-aarch64, and
# qemu-system-x86 provides qemu-system-x86_64.
apt_updated=
for pair in qemu-system-aarch64:qemu-system-arm qemu-system-x86_64:qemu-system-x86; do
  binary=${pair%%:*} package=${pair#*:}
  if ! command -v "$binary" >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      [ -n "$apt_updated" ] || { apt-get update -qq >/dev/null; apt_updated=1; }
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$package" >/dev/null
    else
      echo "error: $binary is missing: install the Debian package $package" >&2
      exit 1
    fi
  fi
  "$binary" --version | head -n 1
done
cargo clippy -p numaframe-unikernel --locked --target aarch64-unknown-none --all-features -- -D warnings
cargo clippy -p numaframe-unikernel --locked --target x86_64-unknown-none -- -D warnings
# The QEMU tests build into these target directories themselves (their own, so they do not wait
# for the lock the running `cargo test` holds); building here first keeps that a no-op.
for target in aarch64-unknown-none x86_64-unknown-none; do
  CARGO_TARGET_DIR=target/unikernel cargo build -p numaframe-unikernel --locked --release \
    --target "$target" --quiet
done
CARGO_TARGET_DIR=target/unikernel-defmt cargo build -p numaframe-unikernel --locked --release \
  --target aarch64-unknown-none --features defmt --quiet

step "workspace tests and doctests (optimised, debug assertions and overflow checks on)"
cargo test --workspace --locked --profile release-checked
# The core's `poison` debug mode, off in the run above.
cargo test -p numaframe-tests --locked --profile release-checked --features poison --test poison

step "loom models (--cfg numaframe_loom, debug assertions and overflow checks on)"
# A model's setup (booting a machine) takes a few thousand loom operations, beyond loom's
# default limit of 1000 branches per execution.
RUSTFLAGS="--cfg numaframe_loom" CARGO_TARGET_DIR=target/loom \
  LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-3}" LOOM_MAX_BRANCHES="${LOOM_MAX_BRANCHES:-10000}" \
  cargo test -p numaframe-loom --locked --profile release-checked --tests
step "robustness: Miri on the core's unit tests, fuzz smoke runs (scripts/robustness.sh)"
bash scripts/robustness.sh

echo
echo "all checks passed"
