#!/usr/bin/env bash
# Usage: [GRAPHTRAINER_STACK=pinned|newest] bash scripts/env.sh COMMAND [ARGS...]
# Makes a venv with one tested set of versions the first time, or when that set or setup.cfg
# changes, then runs COMMAND inside it from the repository root. A second run reinstalls
# nothing. The sets:
#   pinned (default)  requirements/tested.txt  ./.venv         torch 2.2.1, DGL's own support
#   newest            requirements/newest.txt  ./.venv-newest  the newest torch, dgl 2.1.0
#                                                              behind graphtrainer/_compat
# GRAPHTRAINER_VENV and PYTHON override the venv path and the interpreter that creates it
# (Python 3.10 or newer; 3.11 is what is tested).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
stack="${GRAPHTRAINER_STACK:-pinned}"
case "$stack" in
  pinned) requirements="$root/requirements/tested.txt"; default_venv="$root/.venv" ;;
  newest) requirements="$root/requirements/newest.txt"; default_venv="$root/.venv-newest" ;;
  *) echo "[env.sh] GRAPHTRAINER_STACK must be 'pinned' or 'newest', not '$stack'" >&2; exit 2 ;;
esac
venv="${GRAPHTRAINER_VENV:-$default_venv}"
stamp="$venv/.graphtrainer-tested-set"
no_deps="$root/requirements/no-deps.txt"  # test-only packages whose dependencies must stay out
want="$(cat "$requirements" "$no_deps" "$root/setup.cfg" | sha256sum | cut -c1-16)"

if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  if [ ! -x "$venv/bin/python" ]; then
    py="${PYTHON:-}"
    if [ -z "$py" ]; then
      for candidate in python3.11 python3.10 python3; do
        if command -v "$candidate" >/dev/null 2>&1; then py="$candidate"; break; fi
      done
    fi
    "$py" -c 'import sys; assert sys.version_info >= (3, 10), "graphtrainer needs Python >= 3.10"'
    echo "[env.sh] creating $venv with $("$py" --version)" >&2
    "$py" -m venv "$venv"
  fi
  echo "[env.sh] installing the $stack tested set (first time: a few minutes, torch is a few GB)" >&2
  # Each set is installed exactly as pinned: a machine-wide pip constraints file (one that caps
  # torch at the releases kept on a machine's disk, say) would make the newest set impossible.
  # No pip cache: it would keep a second copy of the multi-GB torch and CUDA wheels on disk.
  PIP_CONSTRAINT=/dev/null "$venv/bin/python" -m pip install --disable-pip-version-check -q --no-cache-dir \
      -r "$requirements" -e "$root[dev,bench]" 2>&1 \
      | grep -v "is ignored: it is neither a file nor a directory" >&2 || true
  PIP_CONSTRAINT=/dev/null "$venv/bin/python" -m pip install --disable-pip-version-check -q --no-cache-dir \
      --no-deps -r "$no_deps" 2>&1 \
      | grep -v "is ignored: it is neither a file nor a directory" >&2 || true
  if ! "$venv/bin/python" -c "import graphtrainer, dgl" 2>/dev/null; then
    echo "[env.sh] install failed: 'import graphtrainer, dgl' does not work in $venv" >&2
    # The usual cause on a fresh machine: a set needs about 6 GB in its venv, more while installing.
    free_mb="$(df -Pm "$venv" | awk 'NR == 2 {print $4}')"
    echo "[env.sh] $free_mb MB free on the venv's disk (a set needs about 9,000 MB while installing);" \
         "if that is short, free space or point GRAPHTRAINER_VENV at a bigger disk" >&2
    exit 1
  fi
  echo "$want" > "$stamp"
fi

export PATH="$venv/bin:$PATH" VIRTUAL_ENV="$venv" DGLBACKEND=pytorch GRAPHTRAINER_STACK="$stack"
cd "$root"
exec "$@"
