#!/usr/bin/env bash
# Recording speed, before and after a change to the recorder, side by side in one run (issue #30): the same
# 40 demonstrations (libero_goal task 1, init states 0-39, 16 simulators) recorded by an older tree's
# record_demos.py and by this tree's. On the GPU device the simulators are this tree's in both (they start from
# the LIBERO wrapper, whose PYTHONPATH names this repo first): only the recording process and its writers differ.
# On a machine with requirements/install.sh's environments both use this checkout's .venv-libero, and each
# tree's simulator server module is its own.
#
#   source benchmarks/gpu/device_env.sh && source benchmarks/gpu/libero_env.sh   # carried: main, sft, libero
#   git archive <commit> rlinf_cosmos3 toolkits/libero | xz > before.tar.xz      # here, for the older tree
#   bash benchmarks/gpu/record_before_after.sh OUT_DIR BEFORE_TAR_XZ [NUM_ENVS] [INIT_STATES]
#   bash benchmarks/gpu/record_before_after.sh /tmp/rba before.tar.xz 2 6     # the 2-core CPU box: 6 demos
#
# Writes, as each recording ends: OUT_DIR/record40_{after,before}.json (record_demos.py --summary-json: where the
# time went) and OUT_DIR/summary.txt (exit code and wall time of each). The after-run goes first; each has a
# time limit (RECORD_LIMIT_S, 270 s) so a slow one cannot take the call.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
OUT="${1:?usage: $0 OUT_DIR BEFORE_TAR_XZ [NUM_ENVS] [INIT_STATES]}"; BEFORE="${2:?BEFORE_TAR_XZ}"
ENVS="${3:-16}"; STATES="${4:-40}"
if [ -n "${RLINF_DEVICE_PYTHON:-}" ]; then PY="$RLINF_DEVICE_PYTHON"
elif [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"   # a machine with requirements/install.sh's envs
else PY="$(command -v python3)"; fi
# The older tree looks for .venv-libero inside itself: point both at this checkout's simulator environment
# (on the device libero_env.sh has set it already).
if [ -z "${RLINF_COSMOS3_LIBERO_PYTHON:-}" ] && [ -x "$ROOT/.venv-libero/bin/python" ]; then
  export RLINF_COSMOS3_LIBERO_PYTHON="$ROOT/.venv-libero/bin/python"
fi
WORK="$(mktemp -d /tmp/record_before_after.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
# the older tree's source and each recording's output live apart (the recorder refuses an existing --out)
mkdir -p "$OUT" "$WORK/src_before"
tar -C "$WORK/src_before" -xJf "$BEFORE"
record() {  # record NAME PYTHONPATH_PREFIX SCRIPT
  local t0 rc; t0=$(date +%s)
  PYTHONPATH="$2${PYTHONPATH:-}" timeout "${RECORD_LIMIT_S:-270}" "$PY" "$3" --suite libero_goal --task-ids 1 \
    --init-states "$STATES" --num-envs "$ENVS" --out "$WORK/out_$1" --repo-id local/rec40 --no-progress \
    --summary-json "$OUT/record40_$1.json" > "$WORK/$1.log" 2>&1
  rc=$?
  echo "$1: rc=$rc wall $(( $(date +%s) - t0 )) s; $(grep -a 'recorded .* in' "$WORK/$1.log" | tail -1)" \
    | tee -a "$OUT/summary.txt"
  # a failed run says why where the results go (its work directory is removed on exit)
  [ "$rc" -eq 0 ] || tail -n 20 "$WORK/$1.log" | tee -a "$OUT/summary.txt"
}
record after "" toolkits/libero/record_demos.py
record before "$WORK/src_before:" "$WORK/src_before/toolkits/libero/record_demos.py"
