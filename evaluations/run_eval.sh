#!/usr/bin/env bash
# Evaluate a Cosmos3 policy in a simulator:
#   bash evaluations/run_eval.sh libero <config-name> [hydra overrides...]
#   e.g. bash evaluations/run_eval.sh libero libero_spatial_cosmos3_eval_tiny rollout.rollout_backend=embedded
# Logs, results.jsonl, summary.json, TensorBoard and videos: logs/<timestamp>-<config-name>/
# (runner.experiment_name=NAME names it logs/<timestamp>-NAME/ instead; runner.logs_dir=DIR moves it).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SIM="${1:-}"; CONFIG="${2:-}"
if [ "$SIM" != "libero" ] || [ -z "$CONFIG" ]; then
  echo "usage: $0 libero <config-name> [hydra overrides...]" >&2
  echo "configs: $(cd "$ROOT/evaluations/libero" && ls *.yaml | sed 's/\.yaml$//' | tr '\n' ' ')" >&2
  exit 2
fi
shift 2
if [ ! -f "$ROOT/evaluations/$SIM/$CONFIG.yaml" ]; then
  echo "no config '$CONFIG' in evaluations/$SIM/ (have: $(cd "$ROOT/evaluations/$SIM" && ls *.yaml | sed 's/\.yaml$//' | tr '\n' ' '))" >&2
  exit 2
fi
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
case "$PYTHON" in */*) ;; *) PYTHON="$(command -v "$PYTHON" || echo "$PYTHON")" ;; esac  # PYTHON=python3 works too
[ -x "$PYTHON" ] || { echo "no $PYTHON: run 'bash requirements/install.sh' first (or set PYTHON to a Python that has the project's packages)" >&2; exit 1; }
# Local servers must never go through a proxy (the reference FAQ's "local requests blocked by proxy").
export NO_PROXY="127.0.0.1,localhost${NO_PROXY:+,$NO_PROXY}" no_proxy="127.0.0.1,localhost${no_proxy:+,$no_proxy}"
cd "$ROOT"
exec "$PYTHON" evaluations/eval_embodiment.py --config-path "$SIM" --config-name "$CONFIG" "$@"
