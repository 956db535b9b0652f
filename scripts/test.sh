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

step "workspace tests and doctests"
cargo test --workspace --locked --release

step "loom models (--cfg numaframe_loom)"
RUSTFLAGS="--cfg numaframe_loom" CARGO_TARGET_DIR=target/loom LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-3}" \
  cargo test -p numaframe-loom --locked --release --tests
echo
echo "all checks passed"
