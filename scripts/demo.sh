#!/usr/bin/env bash
# Builds the polestar executable and runs the main job: the bundled model
# (models/polestar-tiny) decodes two prompts of its task suite with Fast-dLLM's dual cache and
# with Polestar side by side, both canvases filling in live. Only the executable is built (the
# tests, fuzzers and benchmarks are scripts/test.sh's business), so the first decode comes
# within minutes of a fresh clone.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$(nproc)" --target polestar
# Two prompts of the task suite the model was trained on (`polestar tasks` lists them); one
# thread, as the tiny model's products are too small to share.
for prompt in "Reverse the list: Emma King, Alan Jones, Olga Hughes" "Compute 362 + 376."; do
  echo "== $prompt"
  build/tools/polestar/polestar generate -p "$prompt" --policy fast-dllm-dual --compare polestar \
    --threshold 0.9 --gen-length 32 --block-length 8 --steps 32 -t 1 --visual
done
