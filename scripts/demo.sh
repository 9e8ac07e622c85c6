#!/usr/bin/env bash
# Builds everything and runs the main job: a demo generation, the canvas filling in live.
# Uses the bundled model (models/polestar-tiny) when present; otherwise the trained probe
# checkpoint of the test fixtures (../shared/fixtures/llada-probe), decoding the same prompt
# with Fast-dLLM's dual cache and with Polestar side by side.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$(nproc)"
polestar=build/tools/polestar/polestar

if [[ -f models/polestar-tiny/config.json ]]; then
  # Two prompts of the task suite the model was trained on (`polestar tasks` lists them).
  for prompt in "Reverse the list: Emma King, Alan Jones, Olga Hughes" "Compute 362 + 376."; do
    for policy in fast-dllm-dual polestar; do
      echo "== $policy: $prompt"
      "$polestar" generate -p "$prompt" --policy "$policy" --threshold 0.9 \
        --gen-length 32 --block-length 8 --steps 32 --visual
    done
  done
  exit 0
fi

probe=${POLESTAR_SHARED:-../shared}/fixtures/llada-probe
if [[ ! -f $probe/config.json ]]; then
  echo "demo: neither models/polestar-tiny nor $probe is here" >&2
  exit 1
fi
# The probe's character vocabulary: "S5,6,8,7,3,2,7>" asks it to sort digits (left-padded to 20).
prompt=49,49,49,49,49,46,5,14,6,14,8,14,7,14,3,14,2,14,7,13
"$polestar" inspect -m "$probe"
for policy in fast-dllm-dual polestar; do
  echo "== $policy"
  "$polestar" generate -m "$probe" --prompt-ids "$prompt" --policy "$policy" --threshold 0.9 \
    --gen-length 32 --block-length 8 --steps "$([[ $policy == polestar ]] && echo 32 || echo 4)" \
    --visual --json | python3 -c 'import json,sys
o=json.load(sys.stdin); chars="0123456789+-=>,:| abcdefghijklmnopqrstuvwxyzARS"
text="".join(chars[t] for t in o["generated"] if t < len(chars))
print("answer:", text, "| forwards:", o["nfe"], "| tokens/forward:", round(o["tpf"]["all_positions"], 2))'
done
