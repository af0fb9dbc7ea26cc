#!/usr/bin/env bash
# Launch SFT: bash examples/sft/run_vla_sft.sh <config-name> [hydra overrides...]
#   e.g. bash examples/sft/run_vla_sft.sh libero_sft_cosmos3_tiny runner.max_steps=10
# Logs go to logs/<timestamp>-<config-name>/run_embodiment.log (plus TensorBoard events beside it).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CONFIG="${1:-}"
if [ -z "$CONFIG" ]; then
  echo "usage: $0 <config-name> [hydra overrides...]" >&2
  echo "configs: $(cd "$ROOT/examples/sft/config" && ls *.yaml | sed 's/\.yaml$//' | tr '\n' ' ')" >&2
  exit 2
fi
shift
if [ ! -f "$ROOT/examples/sft/config/$CONFIG.yaml" ]; then
  echo "no config '$CONFIG' in examples/sft/config/ (have: $(cd "$ROOT/examples/sft/config" && ls *.yaml | sed 's/\.yaml$//' | tr '\n' ' '))" >&2
  exit 2
fi
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
case "$PYTHON" in */*) ;; *) PYTHON="$(command -v "$PYTHON" || echo "$PYTHON")" ;; esac  # PYTHON=python3 works too
[ -x "$PYTHON" ] || { echo "no $PYTHON: run 'bash requirements/install.sh' first (or set PYTHON to a Python that has the project's packages)" >&2; exit 1; }
cd "$ROOT"
exec "$PYTHON" examples/sft/train_vla_sft.py --config-name "$CONFIG" "$@"
