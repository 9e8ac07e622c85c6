#!/usr/bin/env bash
# Checks that GGUF files written by `polestar convert` load in llama.cpp, with llama.cpp's own
# code: ggml's gguf reader (llama-gguf), its vocabulary loader and tokenizer (llama-tokenize,
# whose ids must be polestar's), its model loader and LLaDA diffusion sampler
# (llama-diffusion-cli, which must load the bundled model and generate), and its loader and
# forward pass on token ids (llama-bench, for the vocabulary-less file).
#
#   scripts/check-gguf-llamacpp.sh LLAMA_CPP_SRC_DIR
#       builds llama-gguf, llama-tokenize, llama-diffusion-cli and llama-bench from a llama.cpp
#       source tree
#       (CPU only, in LLAMA_CPP_SRC_DIR/build-polestar-check unless LLAMA_CPP_BUILD_DIR says
#       otherwise; ccache when installed; -j$JOBS, default 2) and runs the checks;
#   LLAMA_CPP_BIN_DIR=DIR scripts/check-gguf-llamacpp.sh
#       runs them with those tools already built (or packaged) in DIR.
#
# POLESTAR names the polestar binary (default build/tools/polestar/polestar); WORK_DIR the
# scratch folder (default a new temporary one). Files checked, converted from
# models/polestar-tiny:
#   tiny-f32.gguf, tiny-q8_0.gguf  the bundled model with its tokenizer, chat template and
#                                  generation_config.json;
#   no-vocab.gguf                  the same weights from a folder without tokenizer files:
#                                  llama.cpp's vocabulary-less model, read by llama-gguf and
#                                  run on random ids by llama-bench (text needs a vocabulary).
# Exits non-zero at the first check that fails; prints each tool's output as it goes.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
POLESTAR=${POLESTAR:-$ROOT/build/tools/polestar/polestar}
TOOLS="llama-gguf llama-tokenize llama-diffusion-cli llama-bench"

if [[ -n "${LLAMA_CPP_BIN_DIR:-}" ]]; then
  BIN=$LLAMA_CPP_BIN_DIR
elif [[ $# -eq 1 && -f "$1/CMakeLists.txt" ]]; then
  SRC=$(cd "$1" && pwd)
  BUILD=${LLAMA_CPP_BUILD_DIR:-$SRC/build-polestar-check}
  launcher=()
  if command -v ccache > /dev/null; then
    launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  fi
  echo "== building $TOOLS from $SRC ($(git -C "$SRC" describe --tags --always 2> /dev/null ||
    echo 'not a git checkout')) in $BUILD"
  cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF \
    "${launcher[@]}" > "$BUILD.cmake.log" 2>&1 || { cat "$BUILD.cmake.log"; exit 1; }
  # shellcheck disable=SC2086  # TOOLS is a list of targets
  cmake --build "$BUILD" -j "${JOBS:-2}" --target $TOOLS
  BIN=$BUILD/bin
else
  echo "usage: $0 LLAMA_CPP_SRC_DIR   or   LLAMA_CPP_BIN_DIR=DIR $0" >&2
  exit 2
fi
for tool in $TOOLS; do
  [[ -x "$BIN/$tool" ]] || { echo "no $tool in $BIN" >&2; exit 1; }
done
[[ -x "$POLESTAR" ]] || { echo "no polestar binary at $POLESTAR (set POLESTAR)" >&2; exit 1; }
"$BIN/llama-diffusion-cli" --version 2>&1 | head -n 2

WORK=${WORK_DIR:-$(mktemp -d)}
mkdir -p "$WORK"
TINY=$ROOT/models/polestar-tiny
PROMPT="Compute 362 + 376."

"$POLESTAR" convert -q -m "$TINY" -o "$WORK/tiny-f32.gguf" --type f32
"$POLESTAR" convert -q -m "$TINY" -o "$WORK/tiny-q8_0.gguf" --type q8_0
mkdir -p "$WORK/no-vocab"
ln -sf "$TINY/config.json" "$TINY/model.safetensors" "$WORK/no-vocab/"
"$POLESTAR" convert -q -m "$WORK/no-vocab" -o "$WORK/no-vocab.gguf" --type f32

for file in tiny-f32 tiny-q8_0 no-vocab; do
  echo "== llama-gguf $file.gguf (ggml's gguf reader)"
  "$BIN/llama-gguf" "$WORK/$file.gguf" r n > "$WORK/$file.llama-gguf.log" 2>&1 ||
    { cat "$WORK/$file.llama-gguf.log"; exit 1; }
  grep -E 'n_tensors|kv\[[0-9]+\]: key = (general.architecture|tokenizer.ggml.(model|pre))' \
    "$WORK/$file.llama-gguf.log" || true
done

# Text through each tokenizer: digits and spaces (GPT-2's pre-tokenizer keeps " 362" whole
# where Llama 3's would split it), special tokens, newlines, a multi-byte character.
texts=("$PROMPT" "<|start_header_id|>user<|end_header_id|>

What is 7 * 8?<|eot_id|>" "  leading spaces and ünïcode, then 1234567")
for text in "${texts[@]}"; do
  ours="[$("$POLESTAR" tokenize -m "$WORK/tiny-f32.gguf" --text "$text" | sed 's/,/, /g')]"
  theirs=$("$BIN/llama-tokenize" -m "$WORK/tiny-f32.gguf" -p "$text" --ids --no-bos \
    --log-disable 2> "$WORK/llama-tokenize.log" | tail -n 1) ||
    { cat "$WORK/llama-tokenize.log"; exit 1; }
  echo "== tokenize $(printf '%q' "$text")"
  echo "   polestar:  $ours"
  echo "   llama.cpp: $theirs"
  [[ "$ours" == "$theirs" ]] || { echo "token ids differ" >&2; exit 1; }
done

# llama-diffusion-cli applies the GGUF's chat template and runs LLaDA's masked diffusion with
# the model's mask token over a canvas of -ub positions (prompt included) in blocks of 8,
# with low-confidence remasking: its own sampler, not polestar's, so only loading and
# generating are checked here, not the text.
for file in tiny-f32 tiny-q8_0; do
  echo "== llama-diffusion-cli -m $file.gguf -p \"$PROMPT\""
  "$BIN/llama-diffusion-cli" -m "$WORK/$file.gguf" -p "$PROMPT" -ub 64 -b 64 -c 64 \
    --diffusion-steps 64 --diffusion-block-length 8 --temp 0 --seed 1 -t 2 \
    > "$WORK/$file.diffusion.log" 2>&1 || { cat "$WORK/$file.diffusion.log"; exit 1; }
  grep -E 'mask_token_id|total time' "$WORK/$file.diffusion.log" || true
  echo "   text: $(tail -n 1 "$WORK/$file.diffusion.log")"
done
echo "== llama-bench -m no-vocab.gguf (llama.cpp's loader and forward pass on token ids)"
"$BIN/llama-bench" -m "$WORK/no-vocab.gguf" -p 32 -n 0 -r 1 -t 2 > "$WORK/no-vocab.bench.log" 2>&1 ||
  { cat "$WORK/no-vocab.bench.log"; exit 1; }
grep -E '^\|' "$WORK/no-vocab.bench.log"
echo "== polestar generate -m tiny-f32.gguf -p \"$PROMPT\""
"$POLESTAR" generate -m "$WORK/tiny-f32.gguf" -p "$PROMPT"
echo "all checks passed (files in $WORK)"
