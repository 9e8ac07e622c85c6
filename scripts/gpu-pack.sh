#!/usr/bin/env bash
# Fills .gpu/ (kept out of git) with what scripts/gpu-check.sh needs on a GPU machine, where
# none of the project's Debian packages and no network are expected (reference/cuda_notes.md
# section 3): the device binaries from BUILD_DIR and the shared libraries they load beyond
# glibc and cuBLAS (which the GPU machine has) in one xz archive, the fixtures, and the
# authors' reference code for bench/pytorch_reference.py. Then the working tree plus .gpu/
# travels to the GPU machine (the device tool's `carry`), and gpu-check.sh runs there.
#
#   scripts/gpu-pack.sh [BUILD_DIR]     (default: build, configured with POLESTAR_CUDA on)
#
# Reference code: bench/pack_reference.sh copies it from the mirrors the `fetch` tool made of
# NVlabs/Fast-dLLM and gt-synergy-lab/Polestar (MIRRORS, default /work/.mirror); without
# Fast-dLLM's, the PyTorch step of gpu-check.sh is skipped with the reason.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=.gpu
binaries=(tools/polestar/polestar tests/backend_test tests/device_agreement_test tests/decode_test
          bench/gpu_rates bench/op_bench bench/server_load)

for b in "${binaries[@]}"; do
  [ -x "$build/$b" ] || { echo "gpu-pack: $build/$b missing: build the device targets first" >&2; exit 1; }
done
ldd "$build/tests/backend_test" | grep -q libcublas ||
  { echo "gpu-pack: $build was built without the CUDA backend (POLESTAR_CUDA)" >&2; exit 1; }

exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >> "$exclude"

rm -rf "$out"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" "$out/shared/fixtures"
for b in "${binaries[@]}"; do
  cp "$build/$b" "$stage/bin/"
  strip "$stage/bin/$(basename "$b")"
done
# Every library the binaries load, except the C library's own and cuBLAS (the GPU machine's).
ldd "$stage"/bin/* | awk '/=> \//{print $3}' | sort -u |
  grep -Ev '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*)\.so|libcublas' |
  while read -r lib; do cp -L "$lib" "$stage/lib/"; done
# This machine's C library and loader, for a GPU machine whose own is older than the binaries
# need (gpu-check.sh then starts them through this loader).
mkdir -p "$stage/glibc"
for lib in /lib64/ld-linux-x86-64.so.2 /lib/x86_64-linux-gnu/{libc.so.6,libm.so.6,libpthread.so.0,libdl.so.2,librt.so.1}; do
  cp -L "$lib" "$stage/glibc/"
done
tar cJf "$out/payload.tar.xz" -C "$stage" bin lib glibc

shared=${POLESTAR_SHARED:-../shared}
cp -r "$shared"/fixtures/* "$out/shared/fixtures/"
cp -r tests/data/fixtures/* "$out/shared/fixtures/"
bench/pack_reference.sh "$out/reference" || echo "gpu-pack: no reference code packed" >&2
echo "gpu-pack: $(du -sh "$out" | cut -f1) in $out; the tree: $(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1) bytes"
