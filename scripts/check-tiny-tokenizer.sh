#!/usr/bin/env bash
# CTest: the bundled model's tokenizer.json / tokenizer_config.json load in the reference JS
# tokenizer (@lenml/tokenizers, fetched by fetch-test-tokenizers.sh) and encode every task's
# prompts and answers to the ids Polestar gives them.
#   scripts/check-tiny-tokenizer.sh POLESTAR MODEL_DIR LENML_PACKAGE_DIR
set -euo pipefail
polestar=$1 model=$2
lenml=$(cd "$3" && pwd)
items=$(mktemp)
trap 'rm -f "$items"' EXIT
for task in $("$polestar" tasks | awk '{ print $1 }'); do
  "$polestar" tasks --task "$task" --split train --n 40 --json --chat --tokenizer "$model" >> "$items"
  "$polestar" tasks --task "$task" --split test --n 40 --json --chat --tokenizer "$model" >> "$items"
done
node "$(dirname "$0")/check_tokenizer_js.mjs" "$lenml/dist/main.mjs" "$model" "$items"
