#!/usr/bin/env bash
# The real launcher and sft_step.py at one shape on the same GPU, one after the other: their samples/s
# side by side (the step benchmark must measure what the worker does; #11 asks for within 10 %).
#
#   source benchmarks/gpu/device_env.sh              # carried: main-site, sft-site, a recorded dataset
#   bash benchmarks/gpu/sft_launcher_vs_step.sh DATASET STATS OUT [LAYERS=4] [STEPS=40] [MICRO=16] [EPISODES=0,1]
#
# 1. `sft_worker_run.sh` with RESUME=0: `run_vla_sft.sh libero_sft_cosmos3` on a Nano-width model cut to
#    LAYERS layers (random bf16 weights written by make_tiny_model.py), micro-batch = global batch MICRO,
#    packed, EMA, the latent cache; its steady rate is the mean over steps 3..STEPS.
# 2. `sft_step.py --model-dir <that same model directory>` with variant pack+mb<MICRO>+ema: the same
#    weights, the same recipe, built by the same library function; the median of 20 timed steps, then 3
#    more under torch.profiler (tables in OUT/profile.tar.gz).
# OUT/comparison.json holds both rates and their ratio; OUT/launcher/ and OUT/sft_step.json the raw runs.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
: "${2:?usage: $0 DATASET STATS OUT [LAYERS] [STEPS] [MICRO] [EPISODES]}"
OUT="${3:?output directory}" LAYERS="${4:-4}" MICRO="${6:-16}"
PY="${RLINF_DEVICE_PYTHON:-$(command -v python3)}"
MODEL="${RLINF_DEVICE_TMP:-/tmp}/cosmos3_nano_${LAYERS}l"  # what sft_worker_run.sh writes and trains
mkdir -p "$OUT"

RESUME=0 bash benchmarks/gpu/sft_worker_run.sh "$1" "$2" "$OUT/launcher" "$LAYERS" "${5:-40}" "$MICRO" "${7:-0,1}"

PYTHONUNBUFFERED=1 "$PY" benchmarks/gpu/sft_step.py --model-dir "$MODEL" --layers "$LAYERS" \
  --global-batch "$MICRO" --variants "pack+mb${MICRO}+ema" --steps 20 --profile "$OUT/profile" \
  --out "$OUT/sft_step.json"
tar -czf "$OUT/profile.tar.gz" -C "$OUT" profile && rm -rf "$OUT/profile"  # '+' in the variant's file name

"$PY" - "$OUT" <<'EOF' | tee "$OUT/comparison.txt"
import json, re, sys
from pathlib import Path
out = Path(sys.argv[1])
summary = (out / "launcher" / "summary.txt").read_text()
launcher = float(re.search(r"logs_a: samples/s median [\d.]+, mean ([\d.]+)", summary).group(1))
(step,) = json.loads((out / "sft_step.json").read_text())["variants"]
ratio = launcher / step["samples_per_s"]
doc = {"launcher_mean_samples_per_s": launcher, "sft_step_samples_per_s": step["samples_per_s"],
       "sft_step_step_time_s": step["step_time_s"], "sft_step_mfu": step["mfu"],
       "launcher_over_sft_step": ratio, "within_10_percent": abs(ratio - 1) <= 0.10}
(out / "comparison.json").write_text(json.dumps(doc, indent=2) + "\n")
print(f"launcher {launcher:.1f} samples/s, sft_step.py {step['samples_per_s']:.1f} samples/s "
      f"(MFU {100 * step['mfu']:.1f} %): ratio {ratio:.3f}, within 10 %: {doc['within_10_percent']}")
EOF
