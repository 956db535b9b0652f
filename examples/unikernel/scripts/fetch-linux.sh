#!/usr/bin/env bash
# Fetches Debian's cloud kernels for one architecture (bookworm's 6.1 and bookworm-backports'
# newest 6.x) into target/linux/, for the opt-in tests that compare the unikernel's
# `numaframe.linux_boot_order` lines with what Linux itself prints on the same QEMU layout:
#   examples/unikernel/scripts/fetch-linux.sh [arm64|amd64]     (default arm64)
#   cargo test --release -p numaframe-tests --test qemu -- --ignored
# Uses apt with a private state directory, so the machine's own apt setup is not touched.
set -euo pipefail
arch=${1:-arm64}
case $arch in
  arm64 | amd64) ;;
  *) echo "error: unknown architecture '$arch' (arm64 or amd64)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/../../.."
out=target/linux
apt_dir=$out/apt-$arch
mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial"
: > "$apt_dir/status"
cat > "$apt_dir/sources.list" <<LIST
deb [arch=$arch signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main
deb [arch=$arch signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm-backports main
LIST
opts=(-o "Dir::Etc::SourceList=$PWD/$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
  -o "Dir::State::Lists=$PWD/$apt_dir/lists" -o "Dir::Cache=$PWD/$apt_dir/cache"
  -o "Dir::State::status=$PWD/$apt_dir/status" -o "APT::Architecture=$arch"
  -o "APT::Architectures::=$arch" -o APT::Sandbox::User=root)
apt-get "${opts[@]}" update -qq
names=$(apt-cache "${opts[@]}" search --names-only "^linux-image-6\\.[0-9.]+.*-cloud-$arch\$" | cut -d' ' -f1)
pick() { grep -E "$1" <<<"$names" | sort -V | tail -n 1; }
for pkg in $(pick '^linux-image-6\.1\.') $(pick '^linux-image-6\.(1[0-9]|[7-9])\.'); do
  (cd "$out" && apt-get "${opts[@]}" download -qq "$pkg:$arch")
  deb=$(ls -t "$out/${pkg}"_*.deb | head -n 1)
  rm -rf "$out/x" && mkdir -p "$out/x" && dpkg-deb -x "$deb" "$out/x"
  cp "$out"/x/boot/vmlinuz-* "$out/${pkg#linux-image-}.vmlinuz"
  rm -rf "$out/x" "$deb"
  echo "$out/${pkg#linux-image-}.vmlinuz"
done
