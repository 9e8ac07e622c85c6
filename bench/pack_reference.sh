#!/usr/bin/env bash
# Copies the reference code bench/pytorch_reference.py imports, and nothing else, out of the
# mirrors the `fetch` tool made (MIRRORS, default /work/.mirror) into OUT_DIR/fast-dllm and
# OUT_DIR/polestar, each with a COMMIT file naming its source. Put OUT_DIR in a git-ignored
# folder that travels to the GPU machine. Polestar is optional: without its mirror it is skipped.
set -euo pipefail
out=${1:?usage: bench/pack_reference.sh OUT_DIR}
here=$(cd "$(dirname "$0")" && pwd)
mirrors=${MIRRORS:-/work/.mirror}

pack() { # NAME OWNER/REPO REQUIRED
  local name=$1 repo=$2 required=$3 git_dir="$mirrors/${2/\//+}/repo" files commit
  if [[ ! -d $git_dir ]]; then
    echo "no mirror of $repo at $git_dir (fetch github:$repo first)" >&2
    [[ $required == required ]] && exit 1
    return 0
  fi
  mapfile -t files < <(python3 "$here/pytorch_reference.py" --list-files "$name")
  commit=$(git --git-dir="$git_dir" rev-parse HEAD)
  rm -rf "${out:?}/$name"
  for f in "${files[@]}"; do # git show reads only these blobs (a mirror may lack its large files)
    mkdir -p "$out/$name/$(dirname "$f")"
    git --git-dir="$git_dir" show "$commit:$f" > "$out/$name/$f"
  done
  echo "$repo $commit" > "$out/$name/COMMIT"
  echo "$name: ${#files[@]} files from $repo at ${commit:0:12}"
}

pack fast-dllm NVlabs/Fast-dLLM required
pack polestar gt-synergy-lab/Polestar optional
du -sh "$out" | cut -f1 | sed 's/^/total: /'
