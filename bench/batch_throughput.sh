#!/usr/bin/env bash
# Items per second of `polestar eval --suite tiny` against the batch size, for each policy:
# every (policy, batch) run REPS times, the batch sizes alternating within each repetition so
# that drift on a shared machine hits them alike; prints the median items/s, its min and max,
# and the ratio of the medians to batch 1. Items/s is items over the wall time of decoding the
# whole (batched) run; accuracy and mean NFE are printed too, and must not change with the batch.
#
#   bench/batch_throughput.sh                      fast-dllm-dual and polestar, batch 1..16, 3 reps
#   POLICIES=polestar BATCHES="1 8" REPS=5 THREADS=2 bench/batch_throughput.sh
#   POLESTAR=build/tools/polestar/polestar EXTRA="--per-task 20" bench/batch_throughput.sh
set -euo pipefail
POLESTAR=${POLESTAR:-build/tools/polestar/polestar}
POLICIES=${POLICIES:-"fast-dllm-dual polestar"}
BATCHES=${BATCHES:-"1 2 4 8 16"}
REPS=${REPS:-3}
THREADS=${THREADS:-2}
EXTRA=${EXTRA:-}
results=$(mktemp)
trap 'rm -f "$results"' EXIT
for rep in $(seq "$REPS"); do
  order=$BATCHES
  # Odd repetitions run the batch sizes in reverse (ABBA), so a trend does not favour one.
  [ $((rep % 2)) -eq 0 ] && order=$(echo "$BATCHES" | tr ' ' '\n' | tac | tr '\n' ' ')
  for policy in $POLICIES; do
    for batch in $order; do
      # shellcheck disable=SC2086
      "$POLESTAR" eval --suite tiny --policy "$policy" --batch "$batch" -t "$THREADS" -q --json \
        $EXTRA | python3 -c "
import json, sys
j = json.load(sys.stdin)
s = j['summary']
print('$policy', $batch, s['items_per_second'], s['accuracy'], s['nfe_mean'], s['items'])" >> "$results"
    done
  done
done
python3 - "$results" "$THREADS" <<'PY'
import statistics, sys
from collections import defaultdict
runs = defaultdict(list)
quality = {}
for line in open(sys.argv[1]):
    policy, batch, ips, acc, nfe, items = line.split()
    runs[(policy, int(batch))].append(float(ips))
    quality.setdefault((policy, int(batch)), set()).add((acc, nfe, items))
print(f"eval --suite tiny, -t {sys.argv[2]}: items/s (median of {len(next(iter(runs.values())))}, min-max)")
print("| policy | batch | items | accuracy | NFE | items/s | min-max | x batch 1 |")
print("|---|--:|--:|--:|--:|--:|--:|--:|")
for (policy, batch), values in sorted(runs.items()):
    median = statistics.median(values)
    base = statistics.median(runs[(policy, min(b for p, b in runs if p == policy))])
    (acc, nfe, items), = quality[(policy, batch)]  # one value: batching changes no result
    print(f"| {policy} | {batch} | {items} | {100 * float(acc):.1f}% | {float(nfe):.2f} | "
          f"{median:.1f} | {min(values):.1f}-{max(values):.1f} | {median / base:.2f} |")
PY
