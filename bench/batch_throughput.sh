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
        $EXTRA | jq -r --arg policy "$policy" --arg batch "$batch" \
        '[$policy, $batch, .summary.items_per_second, .summary.accuracy, .summary.nfe_mean,
          .summary.items] | @tsv' >> "$results"
    done
  done
done
# Per (policy, batch): the median items/s, min, max, and the ratio to the policy's first batch
# size; accuracy, NFE and items must agree across repetitions (batching changes no result).
sort -k1,1 -k2,2n -k3,3g "$results" | awk -F'\t' -v threads="$THREADS" -v reps="$REPS" '
  function flush() {
    if (n == 0) return
    median = n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
    if (policy != base_policy) { base = median; base_policy = policy }
    printf "| %s | %d | %d | %.1f%% | %.2f | %.1f | %.1f-%.1f | %.2f |\n", policy, batch, items,
           100 * acc, nfe, median, v[1], v[n], median / base
    n = 0
  }
  BEGIN {
    printf "eval --suite tiny, -t %s: items/s (median of %s, min-max)\n", threads, reps
    print "| policy | batch | items | accuracy | NFE | items/s | min-max | x batch 1 |"
    print "|---|--:|--:|--:|--:|--:|--:|--:|"
  }
  $1 != policy || $2 != batch { flush(); policy = $1; batch = $2; acc = $4; nfe = $5; items = $6 }
  {
    if ($4 != acc || $5 != nfe || $6 != items) {
      print "batching changed a result: " $0 > "/dev/stderr"; exit 1
    }
    v[++n] = $3
  }
  END { flush() }'
