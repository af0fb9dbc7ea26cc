#!/usr/bin/env bash
# The main job, end to end on this machine (CPU): record LIBERO demonstrations with the real simulator
# into a LeRobot v3 dataset, compute the action statistics, make a tiny random Cosmos3, fine-tune it
# with FSDP2 on 2 CPU ranks (Ray), convert the final checkpoint into a servable diffusers directory, and
# evaluate it in LIBERO against a real SGLang server (on CPU here), pipelined.
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

echo "== 1/6 record $SUITE demonstrations (tasks: $TASKS, $EPISODES per task) -> $DATASET"
rm -rf "$DATASET"
# shellcheck disable=SC2086
$PY toolkits/libero/record_demos.py --suite "$SUITE" --task-ids $TASKS --init-states "$EPISODES" \
  --out "$DATASET" --repo-id local/libero_demos --num-envs 2

echo "== 2/6 action statistics -> $STATS"
$PY toolkits/cosmos3/compute_action_stats.py --data "$DATASET" --out "$STATS"

MODEL="$OUT/cosmos3_tiny"
echo "== 3/6 tiny random Cosmos3 diffusers model -> $MODEL"
$PY toolkits/cosmos3/make_tiny_model.py --out "$MODEL" --overwrite

CKPTS="$OUT/sft/libero_sft_cosmos3_tiny/checkpoints"
echo "== 4/6 SFT (2 gloo ranks on CPU) -> $CKPTS"
# a quickstart run before this one trained another model on other demonstrations: its checkpoints go
rm -rf "$OUT/sft"
bash examples/sft/run_vla_sft.sh libero_sft_cosmos3_tiny actor.model.model_path="$MODEL" \
  data.dataset.root="$DATASET" data.dataset.stats_path="$STATS" runner.log_path="$OUT/sft"

CONVERTED="$OUT/cosmos3_tiny_sft"
echo "== 5/6 convert the newest checkpoint in $CKPTS -> $CONVERTED"
$PY toolkits/cosmos3/convert_checkpoint.py --src "$CKPTS" \
  --base "$MODEL" --out "$CONVERTED" --overwrite

echo "== 6/6 evaluate $CONVERTED in LIBERO (real SGLang server on CPU; a random tiny model rarely succeeds)"
bash evaluations/run_eval.sh libero libero_spatial_cosmos3_eval_tiny rollout.model.model_path="$CONVERTED" \
  rollout.model.action_stats_path="$STATS"
EVAL_RUN=$(ls -dt logs/*-libero_spatial_cosmos3_eval_tiny | head -1)

echo "== done: dataset $DATASET | stats $STATS | checkpoints $CKPTS | servable model $CONVERTED"
echo "   eval: $EVAL_RUN/summary.json, per-episode $EVAL_RUN/results.jsonl, videos $EVAL_RUN/videos"
echo "   run logs and TensorBoard: logs/ (tensorboard --logdir logs)"
