#!/usr/bin/env bash
# One prepared run on a GPU machine (an H200 lent for minutes): the machine's facts and
# limits, the CUDA backend's conformance and agreement with the CPU, the speed table at
# LLaDA-8B's shape beside the authors' PyTorch code on the same card. Everything it learns goes
# under RESULTS_DIR; a short summary is printed last. Each step runs under its own timeout, so
# a hang costs that step alone. Run scripts/gpu-pack.sh on the build machine first (it fills
# .gpu/, which must travel with the tree).
#
#   scripts/gpu-check.sh RESULTS_DIR [--quick | --speed | --moe | --sanitize]
#
# --quick: correctness only (about 4 minutes); --speed: the speed table only (about 6
# minutes); the two fit one device command each, back to back while the machine is warm.
# --moe: the mixtures' speed tables only (LLaDA-MoE-7B-A1B's and LLaDA2-mini's shapes at a
# quarter of their layers, BF16; POLESTAR_GPU_MOE_SHAPES names others), each step beside the
# floor of the experts it read: RESULTS_DIR's scale-<shape>/ and table-<shape>.md.
# --sanitize: correctness, then the conformance suite's exact-mode cases under
# compute-sanitizer's memcheck (slow; for a visit that chases an illegal address).
#
# RESULTS_DIR receives: summary.txt (the step log and the verdicts), log.txt (every step's
# output, the server load test's table among it), rates.json, op_bench.json, the gtest
# results ops.json, agreement.json and decode.json, scale/ (bench --scale), pytorch.json and
# table.md (bench/gpu_table.py).
set -uo pipefail
cd "$(dirname "$0")/.."
results=${1:?usage: scripts/gpu-check.sh RESULTS_DIR [--quick | --speed | --moe | --sanitize]}
mode=${2:-}
mkdir -p "$results"
summary="$results/summary.txt"
log="$results/log.txt"
start=$SECONDS
# The shape timed: LLaDA-8B's unless told (a smaller one tries the script out on any machine).
like=${POLESTAR_GPU_LIKE:-llada-8b}
layer_scale=${POLESTAR_GPU_LAYER_SCALE:-1}
checkpoint=${POLESTAR_GPU_CHECKPOINT:-/tmp/polestar-$like-x$layer_scale}

# step NAME SECONDS COMMAND...: runs COMMAND under a timeout, its output into the log, and
# notes its status and time in the summary.
step() {
  local name=$1 limit=$2
  shift 2
  echo "== $name (at $((SECONDS - start)) s)" >> "$log"
  local begin=$SECONDS
  timeout "$limit" "$@" >> "$log" 2>&1
  local status=$?
  local verdict=ok
  [ $status -eq 124 ] && verdict="TIMED OUT after $limit s"
  [ $status -ne 0 ] && [ $status -ne 124 ] && verdict="FAILED (exit $status)"
  printf '%-12s %-28s %4d s\n' "$name" "$verdict" $((SECONDS - begin)) | tee -a "$summary"
  return $status
}

: > "$summary"
{
  echo "gpu-check $(git rev-parse --short HEAD 2>/dev/null || echo '?') on $(hostname), $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
  grep PRETTY_NAME /etc/os-release
  ldd --version | head -1
  echo "cores $(nproc), memory $(free -g | awk '/Mem:/{print $2}') GiB"
} >> "$summary" 2>&1

rm -rf .gpu/bin .gpu/lib .gpu/glibc  # a run before this one may have wrapped them
tar xJf .gpu/payload.tar.xz -C .gpu || { echo "no .gpu/payload.tar.xz: run scripts/gpu-pack.sh" | tee -a "$summary"; exit 1; }
bin=.gpu/bin
# cuBLAS is the machine's own (the binaries link it shared; the CUDA runtime is static).
cublas=$(ldconfig -p | awk '/libcublas\.so\.13 /{print $NF; exit}')
[ -n "$cublas" ] || cublas=$(ls /usr/local/cuda/lib64/libcublas.so.13 2>/dev/null)
[ -n "$cublas" ] || cublas=$(find /usr /opt -name 'libcublas.so.13' 2>/dev/null | head -1)
echo "cuBLAS: ${cublas:-not found}" >> "$summary"
export LD_LIBRARY_PATH="$PWD/.gpu/lib:$(dirname "${cublas:-/nonexistent/x}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export POLESTAR_SHARED="$PWD/.gpu/shared" POLESTAR_BINARY="$PWD/$bin/polestar"
if ldd "$bin"/* | grep '=> not found' >> "$summary"; then
  echo "the binaries miss libraries (above): nothing runs" | tee -a "$summary"
  exit 1
fi
# Where the machine's C library is older than the binaries need, each binary starts through
# the build machine's loader and C library (.gpu/glibc) behind a wrapper of its name, so the
# binaries the others start (the CLI, the server) go the same way.
# (POLESTAR_GPU_GLIBC=always takes this way anywhere, to try it.)
if [ "${POLESTAR_GPU_GLIBC:-}" = always ] || ! "$bin/backend_test" --gtest_list_tests > /dev/null 2>> "$summary"; then
  echo "the binaries do not start with this machine's C library: through .gpu/glibc" | tee -a "$summary"
  for program in "$bin"/*; do
    mv "$program" "$program.real"
    printf '#!/bin/sh\nexec "%s/.gpu/glibc/ld-linux-x86-64.so.2" --library-path "%s" "$0.real" "$@"\n' \
      "$PWD" "$PWD/.gpu/glibc:$LD_LIBRARY_PATH" > "$program"
    chmod +x "$program"
  done
  "$bin/backend_test" --gtest_list_tests > /dev/null 2>> "$summary" ||
    { echo "nor through .gpu/glibc: nothing runs" | tee -a "$summary"; exit 1; }
fi

step rates 60 "$bin/gpu_rates" --json "$results/rates.json"
if [ "$mode" != --speed ] && [ "$mode" != --moe ]; then
  step ops 180 "$bin/backend_test" --gtest_filter='*cuda*:Cuda*' --gtest_output="json:$results/ops.json"
  step agreement 300 "$bin/device_agreement_test" --gtest_filter='*cuda*' \
    --gtest_output="json:$results/agreement.json"
  # The reference fixtures' runs (PyTorch's tokens and forward counts, LLaDA 2.x's block
  # diffusion included) through the CLI with the CUDA backend in its exact mode.
  POLESTAR_BACKEND=cuda:activations=f32 step decode 150 "$bin/decode_test" \
    --gtest_filter='FixtureDecode.*' --gtest_output="json:$results/decode.json"

  # The server on CUDA: continuous batching against one sequence per forward, streamed, with
  # the bundled model (bench/server_load starts `polestar serve`, which inherits the backend).
  POLESTAR_BACKEND=cuda step serve 120 "$bin/server_load" --polestar "$bin/polestar" \
    -m models/polestar-tiny -c 1,8 -n 48 --stream --max-batch 8
fi

if [ "$mode" = --sanitize ]; then
  step memcheck 400 compute-sanitizer --tool memcheck --error-exitcode 1 "$bin/backend_test" \
    --gtest_filter='*cuda_activations_f32*:Cuda*'
  # The fused attention and the tile product share tiles between warps: shared-memory races
  # are their own risk.
  step racecheck 200 compute-sanitizer --tool racecheck --error-exitcode 1 "$bin/backend_test" \
    --gtest_filter='Cuda*'
elif [ "$mode" = --moe ]; then
  # Bytes bound a mixture's cached steps: the floor counts the experts each step's rows chose
  # (bench --scale counts them in an untimed run; bench/gpu_table.py).
  for shape in ${POLESTAR_GPU_MOE_SHAPES:-llada-moe-7b-a1b llada2-mini}; do
    moe_checkpoint=/tmp/polestar-$shape-x0.25
    step "ckpt-$shape" 150 "$bin/polestar" make-random-model --like "$shape" --scale 0.25 \
      -o "$moe_checkpoint" || continue
    step "scale-$shape" 200 "$bin/polestar" bench --scale --like "$shape" --layer-scale 0.25 \
      --random-model "$moe_checkpoint" --prompt-length 900 --reps 3 \
      --backend "${POLESTAR_GPU_BACKEND:-cuda}" -o "$results/scale-$shape"
    if [ -f "$results/scale-$shape/scale.json" ] && [ -f "$results/rates.json" ]; then
      LD_LIBRARY_PATH= python3 bench/gpu_table.py --rates "$results/rates.json" \
        --scale "$results/scale-$shape/scale.json" > "$results/table-$shape.md" 2>> "$log"
    fi
    rm -rf "$moe_checkpoint"
  done
elif [ "$mode" != --quick ]; then
  step opbench 120 "$bin/op_bench" --backend cuda --json "$results/op_bench.json"
  step checkpoint 200 "$bin/polestar" make-random-model --like "$like" --scale "$layer_scale" \
    -o "$checkpoint"
  step scale 300 "$bin/polestar" bench --scale --paper --like "$like" --layer-scale "$layer_scale" \
    --random-model "$checkpoint" --prompt-length 900 --reps 3 --backend "${POLESTAR_GPU_BACKEND:-cuda}" \
    -o "$results/scale"
  if [ -d .gpu/reference/fast-dllm ]; then
    # The machine's own Python and libraries, not the binaries' (LD_LIBRARY_PATH).
    TORCHDYNAMO_DISABLE=1 PYTHONUNBUFFERED=1 LD_LIBRARY_PATH= step pytorch 300 bash -c \
      "python3 bench/pytorch_reference.py --checkpoint '$checkpoint' \
         --fast-dllm .gpu/reference/fast-dllm --polestar .gpu/reference/polestar \
         --prompt-length 900 --gen 256 --block 32 > '$results/pytorch.json'"
  else
    echo "pytorch      skipped: no .gpu/reference/fast-dllm" | tee -a "$summary"
  fi
  if [ -f "$results/scale/scale.json" ] && [ -f "$results/rates.json" ]; then
    pytorch_json=()
    [ -s "$results/pytorch.json" ] && pytorch_json=(--pytorch "$results/pytorch.json")
    LD_LIBRARY_PATH= python3 bench/gpu_table.py --rates "$results/rates.json" --scale "$results/scale/scale.json" \
      "${pytorch_json[@]}" > "$results/table.md" 2>> "$log"
  fi
fi

# The verdicts: each gtest result's counts, then the speed table.
for suite in ops agreement decode; do
  [ -f "$results/$suite.json" ] || continue
  LD_LIBRARY_PATH= python3 - "$results/$suite.json" "$suite" >> "$summary" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
failed = [f"{s['name']}.{t['name']}" for s in j["testsuites"] for t in s["testsuite"]
          if t.get("failures")]
print(f"{sys.argv[2]}: {j['tests']} tests, {len(failed)} failed" +
      "".join(f"\n  FAILED {name}" for name in failed[:20]))
EOF
done
# A capture the GPU refused leaves steps running op by op (right, but slower): say so.
if grep -q "recording a step as a CUDA graph failed" "$log"; then
  echo "CUDA graphs: a recording failed, so steps ran op by op:" >> "$summary"
  grep -m3 "recording a step as a CUDA graph failed" "$log" >> "$summary"
fi
echo "total $((SECONDS - start)) s" >> "$summary"
cat "$summary"
for table in "$results"/table.md "$results"/table-*.md; do
  [ -f "$table" ] && cat "$table"
done
exit 0
