#!/usr/bin/env bash
# Launch online RL of the Cosmos3 action policy in LIBERO (GRPO, collocated rollouts):
#   bash examples/rl/run_vla_rl.sh <config-name> [hydra overrides...]
#   e.g. bash examples/rl/run_vla_rl.sh libero_rl_cosmos3_tiny runner.max_iterations=2
# Logs go to logs/<timestamp>-<config-name>/rl_embodiment.log (plus TensorBoard events beside it);
# checkpoints to <runner.log_path>/<runner.experiment_name>/checkpoints/global_step_<iteration>/.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CONFIG="${1:-}"
if [ -z "$CONFIG" ]; then
  echo "usage: $0 <config-name> [hydra overrides...]" >&2
  echo "configs: $(cd "$ROOT/examples/rl/config" && ls *.yaml | sed 's/\.yaml$//' | tr '\n' ' ')" >&2
  exit 2
fi
shift
if [ ! -f "$ROOT/examples/rl/config/$CONFIG.yaml" ]; then
  echo "no config '$CONFIG' in examples/rl/config/ (have: $(cd "$ROOT/examples/rl/config" && ls *.yaml | sed 's/\.yaml$//' | tr '\n' ' '))" >&2
  exit 2
fi
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
case "$PYTHON" in */*) ;; *) PYTHON="$(command -v "$PYTHON" || echo "$PYTHON")" ;; esac  # PYTHON=python3 works too
[ -x "$PYTHON" ] || { echo "no $PYTHON: run 'bash requirements/install.sh' first (or set PYTHON to a Python that has the project's packages)" >&2; exit 1; }
cd "$ROOT"
exec "$PYTHON" examples/rl/train_vla_rl.py --config-name "$CONFIG" "$@"
