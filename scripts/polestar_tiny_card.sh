#!/bin/sh
# Assembles models/polestar-tiny from a finished `polestar train` run and measures what its
# model card reports: the loss curve (gnuplot PNG) and held-out accuracy per task under
# vanilla decoding (one token per step), the threshold rule at 0.5 and 0.3, and 4 and 8 tokens
# per step.
#   scripts/polestar_tiny_card.sh [EARLIER_RUN:STEPS ...] RUN_DIR
# EARLIER_RUN:STEPS are the warm-start stages before RUN_DIR, in order, with the step each
# was stopped at; their losses come first in the curve. ITEMS (default 50) and ITEM_SEED
# (default 777) choose the held-out items.
# Writes models/polestar-tiny/{config.json,model.safetensors,tokenizer*.json,loss.png} and
# RUN_DIR/card/*.json, and prints the accuracy table of the model card. Needs gnuplot, jq.
set -eu
items=${ITEMS:-50}
item_seed=${ITEM_SEED:-777}
stages=""
while [ $# -gt 1 ]; do stages="$stages $1"; shift; done
run=$1
root=$(cd "$(dirname "$0")/.." && pwd)
polestar=${POLESTAR:-$root/build/tools/polestar/polestar}
out=$root/models/polestar-tiny
mkdir -p "$out" "$run/card"
for f in config.json model.safetensors tokenizer.json tokenizer_config.json; do
  cp "$run/model/$f" "$out/$f"
done

# Loss per step over all stages (steps counted from the first) and its 50-step mean.
offset=0
boundaries=""
: > "$run/card/loss_all.csv"
for stage in $stages; do
  dir=${stage%:*}
  last=${stage##*:}
  awk -F, -v off=$offset -v last=$last 'NR > 1 && $1 <= last { print $1 + off "," $2 }' \
    "$dir/loss.csv" >> "$run/card/loss_all.csv"
  offset=$((offset + last))
  boundaries="$boundaries $offset"
done
awk -F, -v off=$offset 'NR > 1 { print $1 + off "," $2 }' "$run/loss.csv" >> "$run/card/loss_all.csv"
awk -F, '{ sum += $2; loss[NR] = $2; if (NR > 50) sum -= loss[NR - 50];
           n = NR < 50 ? NR : 50; print $1 "," $2 "," sum / n }' \
  "$run/card/loss_all.csv" > "$run/card/loss_avg.csv"
arrows=""
for b in $boundaries; do
  arrows="$arrows
set arrow from $b, graph 0 to $b, graph 1 nohead dashtype 2 lc rgb '#888888'"
done
gnuplot <<GP
set datafile separator ","
set terminal pngcairo size 800,450
set output "$out/loss.png"
set title "polestar-tiny: LLaDA SFT loss (dashed: warm-start stage boundaries)"
set xlabel "step"
set ylabel "loss (masked CE / t / gen length)"
set logscale y
set grid
$arrows
plot "$run/card/loss_avg.csv" using 1:2 with lines lc rgb "#c8c8c8" title "per step", \
     "$run/card/loss_avg.csv" using 1:3 with lines lw 2 lc rgb "#1f77b4" title "50-step mean"
GP

eval_run() {  # name, then decode flags
  name=$1
  shift
  "$polestar" tasks-eval -m "$out" --items "$items" --item-seed "$item_seed" -t 1 --json \
    --gen-length 32 "$@" > "$run/card/$name.json"
  echo "$name: $(cat "$run/card/$name.json")"
}
eval_run vanilla --block-length 8 --steps 32
eval_run threshold-0.5 --block-length 8 --steps 32 --threshold 0.5
eval_run fixed-4 --block-length 8 --steps 8
eval_run threshold-0.3 --block-length 8 --steps 32 --threshold 0.3
eval_run fixed-8 --block-length 8 --steps 4
# One block over the whole canvas: nothing stops a confident model from filling it at once.
eval_run one-block-vanilla --block-length 32 --steps 32
eval_run one-block-threshold-0.5 --block-length 32 --steps 32 --threshold 0.5
eval_run one-block-fixed-8 --block-length 32 --steps 4
du -b "$out"/* | sort -n >&2

# The accuracy tables of the model card (markdown): one row per task, one column per run.
print_table() {  # header cells, then run names
  header=$1
  shift
  echo
  echo "| task | $header |"
  echo "|---$(printf '|---%.0s' "$@")|"
  for task in $(jq -r '.tasks[].task' "$run/card/$1.json"); do
    row="| $task"
    for name in "$@"; do
      row="$row | $(jq -r ".tasks[] | select(.task == \"$task\") | \"\(.accuracy * 100 | round) % (nfe \(.nfe * 10 | round / 10))\"" "$run/card/$name.json")"
    done
    echo "$row |"
  done
  row="| overall"
  for name in "$@"; do
    row="$row | $(jq -r '"**\(.accuracy * 100 | round) %** (nfe \(.nfe * 10 | round / 10))"' "$run/card/$name.json")"
  done
  echo "$row |"
}
print_table "vanilla, 1 token/step | threshold 0.5 | 4 tokens/step | threshold 0.3 | 8 tokens/step" \
  vanilla threshold-0.5 fixed-4 threshold-0.3 fixed-8
print_table "one block: vanilla, 1 token/step | threshold 0.5 | 8 tokens/step" \
  one-block-vanilla one-block-threshold-0.5 one-block-fixed-8
