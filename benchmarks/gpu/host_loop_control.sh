#!/usr/bin/env bash
# Issue #30's control for the simulator's slow-down from 1 to 4+ processes: the same pure-Python loop (no
# simulator, no GPU, no I/O) in 1, 2, 4, 8 and 16 processes at once. If the loop slows down like the simulator
# does, the host's per-core speed under load is the cause, not LIBERO, its threads or this project's bridge.
#
#   bash benchmarks/gpu/host_loop_control.sh OUT_DIR      # any machine; python3 only
#
# Writes OUT_DIR/loop.txt as each count ends: the seconds of each process, and the CPU MHz lines of /proc/cpuinfo.
set -uo pipefail
OUT="${1:?usage: $0 OUT_DIR}"
PY="${RLINF_DEVICE_PYTHON:-python3}"
mkdir -p "$OUT"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/loop.py" <<'PY'
import time
t = time.perf_counter(); s = 0
for i in range(30_000_000):
    s += i * i
print(f"{time.perf_counter() - t:.3f}")
PY
for n in 1 2 4 8 16; do
  for i in $(seq "$n"); do "$PY" "$tmp/loop.py" > "$tmp/loop_${n}_$i.txt" & done
  wait
  echo "pure-python loop, $n processes: $(cat "$tmp"/loop_"${n}"_*.txt | sort -n | tr '\n' ' ')" | tee -a "$OUT/loop.txt"
done
grep MHz /proc/cpuinfo | sort | uniq -c | head -n 3 | tee -a "$OUT/loop.txt"
