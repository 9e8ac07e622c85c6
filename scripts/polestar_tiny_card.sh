#!/bin/sh
# Assembles models/polestar-tiny from a finished `polestar train` run and measures what its
# model card reports: the loss curve (gnuplot PNG) and held-out accuracy per task under
# vanilla decoding (one token per step), the threshold rule at 0.5, and 4 tokens per step.
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
    --gen-length 32 --block-length 8 "$@" > "$run/card/$name.json"
  echo "$name: $(cat "$run/card/$name.json")"
}
eval_run vanilla --steps 32
eval_run threshold-0.5 --steps 32 --threshold 0.5
eval_run fixed-4 --steps 8
du -b "$out"/* | sort -n >&2

# The accuracy table of the model card (markdown), from the three runs above.
table() {  # jq filter for one cell, given .tasks[] entry t
  for name in vanilla threshold-0.5 fixed-4; do
    jq -r "$1" "$run/card/$name.json"
  done | paste -sd'|'
}
echo
echo "| task | vanilla, 1 token/step | threshold 0.5 | 4 tokens/step |"
echo "|---|---|---|---|"
for task in $(jq -r '.tasks[].task' "$run/card/vanilla.json"); do
  cells=$(table ".tasks[] | select(.task == \"$task\") | \"\(.accuracy * 100 | round) % (nfe \(.nfe * 10 | round / 10))\"")
  echo "| $task | $(echo "$cells" | sed 's/|/ | /g') |"
done
cells=$(table '"**\(.accuracy * 100 | round) %** (nfe \(.nfe * 10 | round / 10))"')
echo "| overall | $(echo "$cells" | sed 's/|/ | /g') |"
