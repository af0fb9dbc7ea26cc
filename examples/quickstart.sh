#!/usr/bin/env bash
# The main job, end to end on this machine (CPU): record LIBERO demonstrations with the real simulator
# into a LeRobot v3 dataset, then compute the action statistics the model is trained and evaluated with.
# Later stages (tiny SFT -> convert -> eval) are appended here as they land.
#
#   bash examples/quickstart.sh [--out DIR] [--episodes-per-task N] [--tasks "0 1"]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="data/quickstart"
EPISODES=2
TASKS="0 1"
SUITE="libero_spatial"
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT="$2"; shift 2 ;;
    --episodes-per-task) EPISODES="$2"; shift 2 ;;
    --tasks) TASKS="$2"; shift 2 ;;
    --suite) SUITE="$2"; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
[ -x .venv/bin/python ] || { echo "no .venv: run 'bash requirements/install.sh' first" >&2; exit 1; }
PY=.venv/bin/python
DATASET="$OUT/libero_demos"
STATS="$OUT/libero_native_frame_wise_relative_rot6d.json"

echo "== 1/2 record $SUITE demonstrations (tasks: $TASKS, $EPISODES per task) -> $DATASET"
rm -rf "$DATASET"
# shellcheck disable=SC2086
$PY toolkits/libero/record_demos.py --suite "$SUITE" --task-ids $TASKS --init-states "$EPISODES" \
  --out "$DATASET" --repo-id local/libero_demos

echo "== 2/2 action statistics -> $STATS"
$PY toolkits/cosmos3/compute_action_stats.py --data "$DATASET" --out "$STATS"

echo "== done: dataset $DATASET, stats $STATS"
