#!/usr/bin/env bash
# Builds everything and runs the main job: a demo generation with the bundled model.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$(nproc)"
./build/tools/polestar/polestar inspect -m ../shared/fixtures/llada-tiny
