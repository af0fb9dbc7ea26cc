#!/usr/bin/env bash
# RL rollout throughput on one GPU host (issue #32): one GRPO round of the real launcher
# (bash examples/rl/run_vla_rl.sh libero_rl_cosmos3_small) per env count, and where the round's time went.
#
#   source benchmarks/gpu/device_env.sh && source benchmarks/gpu/libero_env.sh   # carried: main, sft, libero
#   bash benchmarks/gpu/rl_rollout_throughput.sh OUT_DIR MODEL_DIR STATS_JSON [SUITE] [TASK] [ENV_COUNTS]
#
# MODEL_DIR/STATS_JSON: a converted SFT model and its action stats (e.g. the learning proof's
# WORK/cosmos3_small_sft and WORK/libero_native_frame_wise_relative_rot6d.json); SUITE (libero_spatial) and
# TASK (0) must be in the carried LIBERO archive; ENV_COUNTS ("32 64"): rollout.num_envs, in GRPO groups of 8
# over 2 env workers x 2 pipeline stages (RL_CONFIG: another recipe, e.g. libero_rl_cosmos3_tiny on CPU). Each count is one iteration, no checkpoint, no online eval. Writes
# OUT_DIR/rl_rollout_throughput.json as each count ends: per count the round's env steps/s, decisions/s,
# episodes/s, the sampler's share of the round (sample_time_s / rollout_time_s: near 1 -> sampler-bound,
# near 0 -> simulator-bound) and the update time, read from the run's own TensorBoard scalars.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
OUT="${1:?usage: $0 OUT_DIR MODEL_DIR STATS_JSON [SUITE] [TASK] [ENV_COUNTS]}"
MODEL="${2:?MODEL_DIR}"; STATS="${3:?STATS_JSON}"; SUITE="${4:-libero_spatial}"; TASK="${5:-0}"
COUNTS="${6:-32 64}"
if [ -n "${RLINF_DEVICE_PYTHON:-}" ]; then PY="$RLINF_DEVICE_PYTHON"
elif [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"
else PY="$(command -v python3)"; fi
export PYTHON="$PY"
mkdir -p "$OUT"
for n in $COUNTS; do
  logs="$OUT/runs/envs$n"
  timeout 560 bash examples/rl/run_vla_rl.sh "${RL_CONFIG:-libero_rl_cosmos3_small}" \
    rollout.model.model_path="$MODEL" rollout.model.action_stats_path="$STATS" env.suite="$SUITE" \
    "env.task_ids=[$TASK]" rollout.num_envs="$n" runner.max_iterations=1 runner.save_interval=1000 \
    runner.eval_interval=null runner.logs_dir="$logs" runner.log_path="$logs/ckpt" 2>&1 \
    | grep -E "iteration|ready|ERROR|Error" | tail -n 8
  "$PY" - "$OUT" "$n" "$logs" <<'PY'
import json, sys
from pathlib import Path

sys.path.insert(0, "toolkits")
from plot_training import read_scalars

out, n, logs = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
runs = sorted(p for p in logs.glob("*/") if p.is_dir() and p.name != "ckpt")
row = {"num_envs": n, "run": str(runs[-1]) if runs else None}
if runs:
    scalars = read_scalars(runs[-1])
    for key in ("rollout_time_s", "sample_time_s", "env_steps_per_s", "decisions_per_s", "episodes_per_s",
                "update_time_s", "episode_length", "success_rate", "episodes"):
        tag = f"rl/{key}"
        if tag in scalars:
            row[key] = scalars[tag][1][-1]
    if row.get("rollout_time_s"):
        row["sampler_share"] = row.get("sample_time_s", 0.0) / row["rollout_time_s"]
path = out / "rl_rollout_throughput.json"
rows = json.loads(path.read_text()) if path.exists() else []
rows = [r for r in rows if r["num_envs"] != n] + [row]
path.write_text(json.dumps(rows, indent=1) + "\n")
print(json.dumps(row))
PY
done
