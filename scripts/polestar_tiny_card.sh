#!/bin/sh
# Assembles models/polestar-tiny from a finished `polestar train` run and measures what its
# model card reports: the loss curve (gnuplot PNG) and held-out accuracy per task under
# vanilla decoding (one token per step), the threshold rule at 0.5, and 4 tokens per step.
#   scripts/polestar_tiny_card.sh RUN_DIR [ITEMS] [ITEM_SEED]
# Writes models/polestar-tiny/{config.json,model.safetensors,tokenizer*.json,loss.png} and
# RUN_DIR/card/*.json (the accuracy tables, pasted into the model card).
set -eu
run=$1
items=${2:-50}
item_seed=${3:-777}
root=$(cd "$(dirname "$0")/.." && pwd)
polestar=${POLESTAR:-$root/build/tools/polestar/polestar}
out=$root/models/polestar-tiny
mkdir -p "$out" "$run/card"
for f in config.json model.safetensors tokenizer.json tokenizer_config.json; do
  cp "$run/model/$f" "$out/$f"
done

# Loss per step and its 50-step moving average.
awk -F, 'NR > 1 { sum += $2; loss[NR] = $2; if (NR > 51) sum -= loss[NR - 50];
                  n = NR - 1 < 50 ? NR - 1 : 50; print $1 "," $2 "," sum / n }' \
  "$run/loss.csv" > "$run/card/loss_avg.csv"
gnuplot <<GP
set datafile separator ","
set terminal pngcairo size 800,450
set output "$out/loss.png"
set title "polestar-tiny: LLaDA SFT loss"
set xlabel "step"
set ylabel "loss (masked CE / t / gen length)"
set logscale y
set grid
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
du -b "$out"/* | sort -n
