#!/usr/bin/env bash
# Usage: bash scripts/env.sh COMMAND [ARGS...]
# Makes ./.venv with the tested versions (requirements/tested.txt) the first time, or
# when those files change, then runs COMMAND inside it from the repository root.
# A second run reinstalls nothing. GRAPHTRAINER_VENV and PYTHON override the venv path
# and the interpreter that creates it (Python 3.10 or newer; 3.11 is what is tested).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${GRAPHTRAINER_VENV:-$root/.venv}"
stamp="$venv/.graphtrainer-tested-set"
want="$(cat "$root/requirements/tested.txt" "$root/setup.cfg" | sha256sum | cut -c1-16)"

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
  echo "[env.sh] installing the tested set (first time: a few minutes, torch is ~2.5 GB)" >&2
  "$venv/bin/python" -m pip install --disable-pip-version-check -q \
      -r "$root/requirements/tested.txt" -e "$root[dev,bench]" 2>&1 \
      | grep -v "is ignored: it is neither a file nor a directory" >&2 || true
  "$venv/bin/python" -c "import dgl, graphtrainer" 2>/dev/null \
      || { echo "[env.sh] install failed: 'import dgl, graphtrainer' does not work in $venv" >&2; exit 1; }
  echo "$want" > "$stamp"
fi

export PATH="$venv/bin:$PATH" VIRTUAL_ENV="$venv" DGLBACKEND=pytorch
cd "$root"
exec "$@"
