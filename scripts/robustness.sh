#!/usr/bin/env bash
# Robustness checks: Miri on the core's unit tests, the saved fuzz inputs replayed,
# and a smoke run of every cargo-fuzz target. Fails on any Miri error or fuzz crash.
#
#   scripts/robustness.sh                        the gate: FUZZ_SECONDS=60 per target
#   FUZZ_SECONDS=3600 scripts/robustness.sh      a longer fuzzing session (corpora persist in
#                                                fuzz/corpus/, crashes land in fuzz/artifacts/)
#   SKIP_MIRI=1 scripts/robustness.sh            fuzzing only (SKIP_FUZZ=1: Miri only)
#   FUZZ_JOBS=1 scripts/robustness.sh            targets one after another (default: one per CPU)
#
# One target by hand: `cargo +nightly fuzz run ops` (see fuzz/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

step() { printf '\n==> %s\n' "$*"; }
started=$(date +%s)

NIGHTLY=${NIGHTLY:-nightly}
FUZZ_SECONDS=${FUZZ_SECONDS:-60}
FUZZ_JOBS=${FUZZ_JOBS:-$(nproc 2>/dev/null || echo 1)}
TARGETS=(ops handles topology_toml numactl cmdline fdt)

step "nightly toolchain ($NIGHTLY) with miri and rust-src"
command -v rustup >/dev/null || { echo "error: rustup is required" >&2; exit 1; }
rustup toolchain install "$NIGHTLY" --profile minimal --component miri,rust-src >/dev/null
rustup component add --toolchain "$NIGHTLY" miri rust-src >/dev/null
rustc "+$NIGHTLY" --version

if [[ -z "${SKIP_MIRI:-}" ]]; then
  step "miri: core unit tests (-Zmiri-strict-provenance)"
  cargo "+$NIGHTLY" miri setup >/dev/null
  t0=$(date +%s)
  MIRIFLAGS="-Zmiri-strict-provenance ${MIRIFLAGS_EXTRA:-}" \
    cargo "+$NIGHTLY" miri test -p numaframe --lib --locked
  echo "miri took $(( $(date +%s) - t0 )) s"
fi

if [[ -z "${SKIP_FUZZ:-}" ]]; then
  step "cargo-fuzz"
  if ! cargo "+$NIGHTLY" fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
  fi
  cargo "+$NIGHTLY" fuzz --version

  step "fuzz: saved crash inputs and seeds, replayed without libFuzzer"
  cargo "+$NIGHTLY" test --manifest-path fuzz/Cargo.toml --locked --release --quiet

  step "fuzz: build every target (nightly, AddressSanitizer)"
  cargo "+$NIGHTLY" fuzz build --fuzz-dir fuzz

  step "fuzz: ${FUZZ_SECONDS} s per target, ${FUZZ_JOBS} at a time"
  mkdir -p fuzz/logs
  run_target() {
    local t=$1
    mkdir -p "fuzz/corpus/$t"
    cargo "+$NIGHTLY" fuzz run --fuzz-dir fuzz "$t" "$root/fuzz/corpus/$t" "$root/fuzz/seeds/$t" -- \
      -max_total_time="$FUZZ_SECONDS" -timeout=30 -print_final_stats=1 \
      >"fuzz/logs/$t.log" 2>&1
  }
  failed=()
  pids=()
  names=()
  for t in "${TARGETS[@]}"; do
    run_target "$t" &
    pids+=($!)
    names+=("$t")
    if (( ${#pids[@]} >= FUZZ_JOBS )); then
      if ! wait "${pids[0]}"; then failed+=("${names[0]}"); fi
      pids=("${pids[@]:1}")
      names=("${names[@]:1}")
    fi
  done
  for i in "${!pids[@]}"; do
    if ! wait "${pids[$i]}"; then failed+=("${names[$i]}"); fi
  done
  for t in "${TARGETS[@]}"; do
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "fuzz/logs/$t.log" | tail -1)
    printf '  %-14s %s runs\n' "$t" "${runs:-?}"
  done
  if (( ${#failed[@]} > 0 )); then
    for t in "${failed[@]}"; do
      printf '\n--- fuzz target %s failed (fuzz/logs/%s.log) ---\n' "$t" "$t"
      grep -v '^#[0-9]' "fuzz/logs/$t.log" | tail -60
    done
    # Last, so that a log cut to its tail still shows what failed and the input to replay.
    for t in "${failed[@]}"; do
      printf '\n--- fuzz target %s: its input and the failure ---\n' "$t"
      for a in fuzz/artifacts/"$t"/*; do
        [[ -f $a ]] || continue
        echo "$a, base64 (save with: base64 -d > fuzz/regressions/$t/NAME):"
        base64 -w 0 "$a"
        echo
      done
      grep -m 4 -E 'panicked at|^==[0-9]+==ERROR|deadly signal|libFuzzer: (timeout|out-of-memory)' \
        "fuzz/logs/$t.log" || true
    done
    echo
    echo "error: fuzz targets crashed: ${failed[*]}" >&2
    echo "Minimise with 'cargo +nightly fuzz tmin <target> <artifact>', save the input under" >&2
    echo "fuzz/regressions/<target>/ and add a test (tests/tests/hostile.rs)." >&2
    exit 1
  fi
fi

echo
echo "robustness checks passed in $(( $(date +%s) - started )) s"
