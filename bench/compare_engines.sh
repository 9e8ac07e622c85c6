#!/usr/bin/env bash
# Polestar against diffuse-cpp (the ggml-based CPU dLLM engine) on the same GGUF files, same
# machine, alternating runs (ABBA order), N repetitions: medians, min and max, ours / theirs.
#
# Workloads (prompt P = 32 ids, the same ids on both sides; every number is wall-clock):
#   full      seconds per full forward of P + 64 rows, all 96 rows' logits out. Ours:
#             bench/forward_bench (--warmup 1, then --forwards F timed forwards). Theirs:
#             diffuse-cli --no-cache -s F+1 -n 64, its per-step "fwd=" times of steps 2..F+1
#             (step 1 is the warm-up; with --no-cache every step is diffuse_forward_full).
#             A run's value is the median of its F forwards.
#   e2e64, e2e256
#             one generation of 64 / 256 tokens in 16 forwards, seconds of the decoding loop
#             (model loading excluded, sampling included). Theirs: diffuse-cli -s 16 -n G with
#             its inter-step cache (the default): a full forward at step 1, then steps that
#             compute only the still-masked and just-changed positions (cosine schedule,
#             low_confidence); its "TOTAL" time. Ours: polestar generate --policy
#             fast-dllm-prefix --block-length G --steps 16 (a full forward, then 15 steps of the
#             G canvas rows over the cached prompt; fixed-count commits) --json, its "seconds".
#             Ours computes more rows than theirs (every canvas row each step against only the
#             masked and changed ones): both are recorded as layer_rows (rows x layers summed
#             over the forwards).
#
# --load starts a competing CPU-bound process for the whole measurement (stress-ng --cpu 1 by
# default, --load-cmd for another, e.g. a second copy of an engine), stopped at the end; every
# run records the 1-minute load average before and after it.
#
# Building diffuse-cpp (outside this repository; nothing of it is committed here):
#   git clone https://github.com/iafiscal1212/diffuse-cpp /work/ext/diffuse-cpp
#   git -C /work/ext/diffuse-cpp checkout 1d2bd6a
#   git clone https://github.com/ggml-org/ggml /work/ext/diffuse-cpp/ggml   # its submodule path
#   git -C /work/ext/diffuse-cpp/ggml checkout v0.9.8
#   cmake -S /work/ext/diffuse-cpp -B /work/ext/diffuse-cpp/build -G Ninja \
#     -DCMAKE_BUILD_TYPE=Release -DDIFFUSE_BUILD_TESTS=OFF    # GGML_NATIVE (-march=native), OpenMP
#   cmake --build /work/ext/diffuse-cpp/build -j2             # build/diffuse-cli
# The models (ours, then the same file with diffuse.* keys copied from llada.*, tensor data
# byte-identical, which diffuse-cpp needs to read the hyperparameters):
#   polestar make-random-model --like llada-1b -o M/llada-1b-random
#   polestar convert -m M/llada-1b-random -o M/llada-1b-random-Q4_K_M.gguf --type q4_k_m  # f16, q8_0
#   (a GGUF copy adding diffuse.X for every llada.X key and diffuse.model_type = "llada")
#
# Running (build/bench/forward_bench and build/tools/polestar/polestar built in Release):
#   bench/compare_engines.sh --diffuse-cli /work/ext/diffuse-cpp/build/diffuse-cli \
#     --model Q4_K_M:M/llada-1b-random-Q4_K_M.gguf:M/llada-1b-random-Q4_K_M.diffuse.gguf \
#     [--model LABEL:OURS.gguf:THEIRS.gguf ...] [--reps 3] [--threads 2] [--forwards 3]
#     [--workloads full,e2e64,e2e256] [--load [--load-cmd CMD]] [--json out.json]
#     [--polestar PATH] [--forward-bench PATH] [--policy fast-dllm-prefix]
# Paths may also come from the environment: POLESTAR, FORWARD_BENCH, DIFFUSE_CLI. The JSON
# (stdout, or --json FILE) holds every run, the summary, the exact commands, both engines'
# commits, the CPU model and the thread count; the table goes to stderr.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
invocation=$(printf '%q ' "$0" "$@")
POLESTAR=${POLESTAR:-$repo/build/tools/polestar/polestar}
FORWARD_BENCH=${FORWARD_BENCH:-$repo/build/bench/forward_bench}
DIFFUSE_CLI=${DIFFUSE_CLI:-}
reps=3 threads=2 forwards=3 steps=16 prompt_length=32 policy=fast-dllm-prefix
workloads=full,e2e64,e2e256 load=0 load_cmd="stress-ng --cpu 1" json_out=""
models=()

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case $1 in
    --polestar) POLESTAR=$2; shift ;;
    --forward-bench) FORWARD_BENCH=$2; shift ;;
    --diffuse-cli) DIFFUSE_CLI=$2; shift ;;
    --model) models+=("$2"); shift ;;
    --reps) reps=$2; shift ;;
    --threads | -t) threads=$2; shift ;;
    --forwards) forwards=$2; shift ;;
    --workloads) workloads=$2; shift ;;
    --policy) policy=$2; shift ;;
    --load) load=1 ;;
    --load-cmd) load=1 load_cmd=$2; shift ;;
    --json) json_out=$2; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "compare_engines.sh: unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
  shift
done
for bin in "$POLESTAR" "$FORWARD_BENCH" "$DIFFUSE_CLI"; do
  [ -x "$bin" ] || { echo "compare_engines.sh: not an executable: '$bin' (--help)" >&2; exit 2; }
done
[ ${#models[@]} -gt 0 ] || { echo "compare_engines.sh: give --model LABEL:OURS:THEIRS" >&2; exit 2; }
for spec in "${models[@]}"; do
  IFS=: read -r label ours theirs <<<"$spec"
  if [ -z "$label" ] || [ ! -f "$ours" ] || [ ! -f "$theirs" ]; then
    echo "compare_engines.sh: --model $spec: want LABEL:OURS.gguf:THEIRS.gguf (existing files)" >&2
    exit 2
  fi
done
command -v jq >/dev/null || { echo "compare_engines.sh: needs jq" >&2; exit 2; }

work=$(mktemp -d)
load_pid=""
cleanup() {
  # The competing load runs in its own process group (setsid): stop that group only.
  [ -n "$load_pid" ] && kill -- "-$load_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

# The same ordinary prompt ids on both sides (no special token of LLaDA's vocabulary).
prompt_ids=$(for ((i = 0; i < prompt_length; i++)); do echo $(((17 + i * 7919) % 60000)); done | paste -sd,)
loadavg() { cut -d' ' -f1 /proc/loadavg; }
now() { date +%s.%N; }
records=$work/records.jsonl
: >"$records"

# run ENGINE LABEL WORKLOAD REP ORDER MODEL: one timed process, one JSON record.
run() {
  local engine=$1 label=$2 workload=$3 rep=$4 order=$5 model=$6 gen cmd
  case $workload in
    full) gen=64 ;;
    e2e*) gen=${workload#e2e} ;;
    *) echo "compare_engines.sh: unknown workload $workload" >&2; exit 2 ;;
  esac
  if [ "$engine" = polestar ]; then
    if [ "$workload" = full ]; then
      cmd=("$FORWARD_BENCH" -m "$model" --prompt-ids "$prompt_ids" --gen-length "$gen"
           --forwards "$forwards" --warmup 1 -t "$threads")
    else
      cmd=("$POLESTAR" generate -m "$model" --prompt-ids "$prompt_ids" --policy "$policy"
           --gen-length "$gen" --block-length "$gen" --steps "$steps" -t "$threads" --json)
    fi
  else
    if [ "$workload" = full ]; then
      cmd=("$DIFFUSE_CLI" -m "$model" --tokens "$prompt_ids" -n "$gen" -s $((forwards + 1))
           -t "$threads" --no-cache)
    else
      cmd=("$DIFFUSE_CLI" -m "$model" --tokens "$prompt_ids" -n "$gen" -s "$steps" -t "$threads")
    fi
  fi
  local before after t0 t1
  before=$(loadavg)
  t0=$(now)
  "${cmd[@]}" >"$work/out" 2>"$work/err" || {
    echo "compare_engines.sh: failed: ${cmd[*]}" >&2
    tail -20 "$work/err" >&2
    exit 1
  }
  t1=$(now)
  after=$(loadavg)
  local value forwards_done layer_rows per_forward
  if [ "$engine" = polestar ]; then
    if [ "$workload" = full ]; then
      value=$(jq .median_seconds "$work/out")
      per_forward=$(jq -c .seconds "$work/out")
      forwards_done=$(jq '.seconds | length' "$work/out")
      layer_rows=$(jq '.layer_rows_computed * (.seconds | length)' "$work/out")
    else
      value=$(jq .seconds "$work/out")
      per_forward=null
      forwards_done=$(jq .nfe "$work/out")
      layer_rows=$(jq .rows_computed "$work/out")
    fi
  else
    # Progress lines end in \r, so the [diffuse] step lines are matched anywhere in a line.
    local layers actives fwds
    layers=$(grep -o 'n_layer=[0-9]*' "$work/err" | head -1 | cut -d= -f2)
    fwds=$(grep -o 'fwd=[0-9.]*ms' "$work/err" | tr -dc '0-9.\n')
    actives=$(grep -o 'ms, active=[0-9]*' "$work/err" | cut -d= -f2)
    forwards_done=$(echo "$fwds" | wc -l)
    layer_rows=$((($(echo "$actives" | paste -sd+)) * layers))
    if [ "$workload" = full ]; then
      # Step 1 is the warm-up; the median of the others, in seconds.
      per_forward=$(echo "$fwds" | tail -n +2 | jq -sc 'map(. / 1000)')
      value=$(echo "$per_forward" | jq 'sort | if length % 2 == 1 then .[length / 2 | floor]
                                         else (.[length / 2 - 1] + .[length / 2]) / 2 end')
      forwards_done=$((forwards_done - 1))
      layer_rows=$((layer_rows - $(echo "$actives" | head -1) * layers))
    else
      value=$(grep -o 'TOTAL: *[0-9.]* ms' "$work/err" | tr -dc '0-9.' | jq -R 'tonumber / 1000')
      per_forward=$(echo "$fwds" | jq -sc 'map(. / 1000)')
    fi
  fi
  jq -nc --arg engine "$engine" --arg model "$label" --arg file "$model" --arg workload "$workload" \
    --argjson rep "$rep" --argjson order "$order" --argjson value "$value" \
    --argjson forwards "$forwards_done" --argjson layer_rows "$layer_rows" \
    --argjson per_forward "$per_forward" --argjson process_wall "$(awk "BEGIN { print $t1 - $t0 }")" \
    --argjson load_before "$before" --argjson load_after "$after" \
    --arg command "$(printf '%q ' "${cmd[@]}")" \
    '{$engine, $model, $file, $workload, $rep, $order, seconds: $value, $forwards, $layer_rows,
      per_forward_seconds: $per_forward, $process_wall, $load_before, $load_after, $command}' \
    >>"$records"
  printf '  %-8s %-7s %-9s rep %d: %.3f s (%s forwards, load %s -> %s)\n' "$label" "$workload" \
    "$engine" "$rep" "$value" "$forwards_done" "$before" "$after" >&2
}

git_head() { git -C "$1" rev-parse HEAD 2>/dev/null || echo unknown; }
diffuse_src=$(cd "$(dirname "$DIFFUSE_CLI")/.." && pwd)
ours_commit=$(git_head "$repo")
ours_dirty=$(git -C "$repo" status --porcelain --untracked-files=no | grep -q . && echo true || echo false)
theirs_commit=$(git_head "$diffuse_src")
ggml_commit=$(git_head "$diffuse_src/ggml")
ggml_tag=$(git -C "$diffuse_src/ggml" describe --tags 2>/dev/null || echo unknown)
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')
started=$(date -u +%FT%TZ)
load_start=$(loadavg)

if [ "$load" = 1 ]; then
  setsid bash -c "exec $load_cmd" >/dev/null 2>&1 &
  load_pid=$!
  sleep 5  # let the competitor reach full speed before the first timed run
fi

IFS=, read -ra workload_list <<<"$workloads"
order=0
for ((rep = 1; rep <= reps; rep++)); do
  echo "repetition $rep of $reps" >&2
  for workload in "${workload_list[@]}"; do
    for spec in "${models[@]}"; do
      IFS=: read -r label ours theirs <<<"$spec"
      # ABBA: polestar first on odd repetitions, diffuse-cpp first on even ones.
      if ((rep % 2 == 1)); then pair=(polestar diffuse-cpp); else pair=(diffuse-cpp polestar); fi
      for engine in "${pair[@]}"; do
        order=$((order + 1))
        if [ "$engine" = polestar ]; then file=$ours; else file=$theirs; fi
        run "$engine" "$label" "$workload" "$rep" "$order" "$file"
      done
    done
  done
done
load_end=$(loadavg)
if [ -n "$load_pid" ]; then
  kill -- "-$load_pid" 2>/dev/null
  load_pid=""
fi

result=$(jq -s \
  --arg started "$started" --arg cpu "$cpu" --argjson cpus "$(nproc)" --arg kernel "$(uname -r)" \
  --argjson threads "$threads" --argjson reps "$reps" --argjson forwards "$forwards" \
  --argjson steps "$steps" --arg prompt_ids "$prompt_ids" --arg policy "$policy" \
  --arg ours_commit "$ours_commit" --argjson ours_dirty "$ours_dirty" \
  --arg theirs_commit "$theirs_commit" --arg ggml_commit "$ggml_commit" --arg ggml_tag "$ggml_tag" \
  --arg load_cmd "$([ "$load" = 1 ] && echo "$load_cmd")" \
  --argjson load_start "$load_start" --argjson load_end "$load_end" \
  --arg invocation "$invocation" '
  def median: sort | if length % 2 == 1 then .[length / 2 | floor]
                     else (.[length / 2 - 1] + .[length / 2]) / 2 end;
  def stats: map(.seconds) | {median: median, min: min, max: max, n: length};
  . as $runs
  | {started: $started,
     machine: {cpu: $cpu, cpus: $cpus, kernel: $kernel},
     threads: $threads, reps: $reps, full_forwards_per_run: $forwards, e2e_steps: $steps,
     invocation: $invocation, prompt_ids: $prompt_ids, polestar_policy: $policy,
     polestar: {commit: $ours_commit, dirty: $ours_dirty},
     diffuse_cpp: {commit: $theirs_commit, ggml_commit: $ggml_commit, ggml_tag: $ggml_tag},
     load: {command: (if $load_cmd == "" then null else $load_cmd end),
            load_average_start: $load_start, load_average_end: $load_end,
            load_average_during_runs: ($runs | map(.load_after) | {min: min, max: max,
                                                                   median: median})},
     summary: [$runs | group_by([.model, .workload])[]
               | (map(select(.engine == "polestar"))) as $a
               | (map(select(.engine == "diffuse-cpp"))) as $b
               | {model: .[0].model, workload: .[0].workload,
                  polestar: ($a | stats), diffuse_cpp: ($b | stats),
                  ours_over_theirs: (($a | stats | .median) / ($b | stats | .median)),
                  layer_rows: {polestar: $a[0].layer_rows, diffuse_cpp: $b[0].layer_rows},
                  forwards: {polestar: $a[0].forwards, diffuse_cpp: $b[0].forwards},
                  commands: {polestar: $a[0].command, diffuse_cpp: $b[0].command}}],
     runs: $runs}' "$records")
if [ -n "$json_out" ]; then echo "$result" >"$json_out"; else echo "$result"; fi

{
  echo
  echo "polestar $ours_commit$([ "$ours_dirty" = true ] && echo ' (dirty)') vs diffuse-cpp $theirs_commit (ggml $ggml_tag)"
  echo "$cpu, $(nproc) CPUs, $threads threads, $reps reps, load average $load_start at start, $load_end at end$([ "$load" = 1 ] && echo ", competing load: $load_cmd")"
  echo
  echo "| model | workload | polestar s (min-max) | diffuse-cpp s (min-max) | ours / theirs | forwards | layer rows ours / theirs |"
  echo "|---|---|--:|--:|--:|--:|--:|"
  echo "$result" | jq -r 'def f: . * 1000 | round / 1000 | tostring;
    .summary[] | "| \(.model) | \(.workload) | \(.polestar.median | f) (\(.polestar.min | f)-\(.polestar.max | f)) | \(.diffuse_cpp.median | f) (\(.diffuse_cpp.min | f)-\(.diffuse_cpp.max | f)) | \(.ours_over_theirs * 100 | round / 100) | \(.forwards.polestar) / \(.forwards.diffuse_cpp) | \(.layer_rows.polestar) / \(.layer_rows.diffuse_cpp) |"'
  echo
  echo "full: seconds per full forward (32 + 64 rows, the logits of every row), median of the"
  echo "forwards of a run; e2eG: seconds of one generation of G tokens in $steps forwards (the"
  echo "decoding loop, model loading excluded)."
} >&2
