#!/usr/bin/env bash
# The real SFT launcher on one GPU: `examples/sft/run_vla_sft.sh libero_sft_cosmos3` (Ray actor, FSDP2
# over NCCL, the LeRobot data reader with the frozen VAE, AdamW, EMA, checkpoint) on a Cosmos3-Nano-width
# model cut to LAYERS decoder layers with random bf16 weights made on the GPU, once with compiled blocks
# and once eager, same data and seed, activation checkpointing off (the config rejects it together with
# compiled blocks; LAYERS=8 fits easily). What sft_step.py measures in isolation, this runs end to end.
#
#   source benchmarks/gpu/device_env.sh              # carried: main-site, sft-site
#   bash benchmarks/gpu/sft_worker_run.sh DATASET STATS OUT [LAYERS=8] [STEPS=6] [VARIANTS="true false"]
#
# DATASET/STATS: a LeRobot v3 LIBERO dataset and its action stats (toolkits/libero/record_demos.py,
# toolkits/cosmos3/compute_action_stats.py). OUT receives each run's log directory (run_embodiment.log,
# TensorBoard, resolved config) and checkpoint sizes; checkpoints themselves go to /tmp and are deleted
# after each run (a full Nano checkpoint does not fit the device's disk twice).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
DATASET="${1:?usage: $0 DATASET STATS OUT [LAYERS] [STEPS] [VARIANTS]}"
STATS="${2:?stats json}"
OUT="${3:?output directory}"
LAYERS="${4:-8}"
STEPS="${5:-6}"
VARIANTS="${6:-true false}"
PY="${RLINF_DEVICE_PYTHON:-$(command -v python3)}"
MODEL="${RLINF_DEVICE_TMP:-/tmp}/cosmos3_nano_${LAYERS}l"
CKPT="${RLINF_DEVICE_TMP:-/tmp}/sft_worker_ckpt"
mkdir -p "$OUT"

if [ ! -f "$MODEL/transformer/config.json" ] || ! ls "$MODEL"/transformer/*.safetensors >/dev/null 2>&1; then
  echo "[sft_worker_run] writing a ${LAYERS}-layer Nano-width model with random weights to $MODEL"
  "$PY" toolkits/cosmos3/make_tiny_model.py --preset nano --num-layers "$LAYERS" --materialize-on cuda \
    --out "$MODEL" --overwrite
fi

for compile in $VARIANTS; do
  name="nano${LAYERS}l_compile_${compile}"
  echo "[sft_worker_run] == $name: $STEPS steps"
  rm -rf "$CKPT"
  start=$(date +%s)
  PYTHON="$PY" bash examples/sft/run_vla_sft.sh libero_sft_cosmos3 \
    cluster.num_gpus_per_node=1 cluster.cpus_per_rank=8 \
    runner.experiment_name="$name" runner.max_steps="$STEPS" runner.save_interval="$STEPS" runner.log_interval=1 \
    runner.logs_dir="$OUT/logs" runner.log_path="$CKPT" \
    actor.micro_batch_size=4 actor.global_batch_size=16 \
    actor.optim.lr_warmup_steps=2 actor.optim.total_training_steps="$STEPS" \
    actor.model.model_path="$MODEL" actor.model.compile_blocks="$compile" actor.model.activation_checkpointing=false \
    data.dataset.root="$DATASET" data.dataset.stats_path="$STATS" data.num_workers=4
  echo "[sft_worker_run] $name: exit 0 after $(( $(date +%s) - start )) s; checkpoint:"
  du -sh "$CKPT"/*/checkpoints/global_step_*/* 2>/dev/null | tee "$OUT/${name}_checkpoint_sizes.txt" || true
  rm -rf "$CKPT"
done
