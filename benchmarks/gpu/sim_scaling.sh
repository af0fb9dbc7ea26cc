#!/usr/bin/env bash
# Simulator scaling on the GPU host (issue #30): benchmarks/sim_step_cost.py with 1..48 LIBERO processes,
# then 16 processes long enough to count each one's threads and to profile one of them with py-spy.
#
#   source benchmarks/gpu/device_env.sh && source benchmarks/gpu/libero_env.sh   # carried: main-site, libero-site
#   bash benchmarks/gpu/sim_scaling.sh OUT_DIR [SUITE] [PY_SPY]
#
# SUITE: the suite the LIBERO archive holds (default libero_goal); PY_SPY: a py-spy binary (default: the one on
# PATH; none: no profile). Writes, as each step ends (a machine taken back keeps what was done):
#   OUT_DIR/sim_scaling.json   one sim_step_cost.py row per process count (warm ms per env step, env-steps/s)
#   OUT_DIR/threads.txt        threads and allowed CPUs of each of the 16 simulator processes
#   OUT_DIR/pyspy_sim16.txt    py-spy's collapsed stacks of one simulator process, 15 s at 200 Hz (--native)
#   OUT_DIR/lscpu.txt
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
OUT="${1:?usage: $0 OUT_DIR [SUITE] [PY_SPY]}"; SUITE="${2:-libero_goal}"; PYSPY="${3:-$(command -v py-spy || true)}"
PY="${RLINF_DEVICE_PYTHON:-python3}"
mkdir -p "$OUT" "$OUT/rows"
lscpu > "$OUT/lscpu.txt"
merge() { "$PY" - "$OUT" <<'PY'
import glob, json, sys
out = sys.argv[1]
rows = [json.load(open(f)) for f in sorted(glob.glob(f"{out}/rows/*.json"))]
json.dump(rows, open(f"{out}/sim_scaling.json", "w"), indent=1)
PY
}
step() {  # step N ROUNDS TAG
  timeout 200 "$PY" benchmarks/sim_step_cost.py --suite "$SUITE" --num-envs "$1" --rounds "$2" \
    --out "$OUT/rows/$3.json" 2>&1 | grep -E '"(make_s|warm_ms_per_env_step)"' | sed "s/^/[$3] /"
  merge
}
for n in 1 4 8 16; do step "$n" 5 "n$(printf %02d "$n")"; done
# 16 again, 80 rounds (~40 s of chunks): threads per process, and a profile of one of them
(
  sleep 25
  pids=$(pgrep -f rlinf_cosmos3.sim.libero_server | head -n 16)
  for p in $pids; do
    echo "$p $(ls "/proc/$p/task" | wc -l) threads, $(grep -i cpus_allowed_list "/proc/$p/status")"
  done > "$OUT/threads.txt"
  if [ -n "$PYSPY" ] && [ -n "$pids" ]; then
    timeout 40 "$PYSPY" record --pid "${pids%% *}" --duration 15 --rate 200 --native --format raw \
      -o "$OUT/pyspy_sim16.txt" > "$OUT/pyspy.log" 2>&1
  fi
) &
step 16 80 n16_long
wait
for n in 32 48; do step "$n" 4 "n$n"; done
