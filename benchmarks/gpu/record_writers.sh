#!/usr/bin/env bash
# Recording speed against the number of writer processes, side by side in one run (issue #30): the same
# 40 demonstrations (libero_goal task 1, init states 0-39, 16 simulators) recorded once per `--writers` value,
# one after another, by this tree's toolkits/libero/record_demos.py. The writers encode each finished episode's
# videos while the simulators go on; too few and the recorder waits to hand episodes over, too many and the
# encoders take the simulators' cores.
#
#   source benchmarks/gpu/device_env.sh && source benchmarks/gpu/libero_env.sh   # on the GPU device
#   bash benchmarks/gpu/record_writers.sh OUT_DIR [WRITERS...]                   # default: 4 8 6 4
#   NUM_ENVS=2 INIT_STATES=6 bash benchmarks/gpu/record_writers.sh /tmp/rw 1 2   # the 2-core CPU box
#
# Writes, as each recording ends: OUT_DIR/writers_<N>[_<i>].json (record_demos.py --summary-json: where the time
# went) and a line in OUT_DIR/summary.txt (exit code, wall time, the recorder's split). A value given twice is
# measured twice (the host's drift shows). Each recording has a time limit (RECORD_LIMIT_S, 130 s).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
OUT="${1:?usage: $0 OUT_DIR [WRITERS...]}"; shift
[ "$#" -gt 0 ] || set -- 4 8 6 4
ENVS="${NUM_ENVS:-16}"; STATES="${INIT_STATES:-40}"
if [ -n "${RLINF_DEVICE_PYTHON:-}" ]; then PY="$RLINF_DEVICE_PYTHON"
elif [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"   # a machine with requirements/install.sh's envs
else PY="$(command -v python3)"; fi
WORK="$(mktemp -d /tmp/record_writers.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$OUT"
declare -A seen=()
for w in "$@"; do
  seen[$w]=$(( ${seen[$w]:-0} + 1 ))
  name="writers_$w"; [ "${seen[$w]}" -gt 1 ] && name="${name}_${seen[$w]}"
  t0=$(date +%s)
  timeout "${RECORD_LIMIT_S:-130}" "$PY" toolkits/libero/record_demos.py --suite libero_goal --task-ids 1 \
    --init-states "$STATES" --num-envs "$ENVS" --writers "$w" --out "$WORK/$name" --repo-id local/rec40 \
    --no-progress --summary-json "$OUT/$name.json" > "$WORK/$name.log" 2>&1
  rc=$?
  echo "$name: rc=$rc wall $(( $(date +%s) - t0 )) s; $(grep -a 'recorded .* in' "$WORK/$name.log" | tail -1)" \
    | tee -a "$OUT/summary.txt"
  [ "$rc" -eq 0 ] || tail -n 20 "$WORK/$name.log" | tee -a "$OUT/summary.txt"   # a failed run says why
  rm -rf "${WORK:?}/$name"
done
