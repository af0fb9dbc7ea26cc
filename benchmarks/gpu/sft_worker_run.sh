#!/usr/bin/env bash
# The real SFT launcher on one GPU, end to end: `examples/sft/run_vla_sft.sh libero_sft_cosmos3` (Ray actor,
# FSDP2 over NCCL, the LeRobot reader through the latent cache, packed micro-batches, AdamW, EMA) on a
# Cosmos3-Nano-width model cut to LAYERS decoder layers with random bf16 weights made on the GPU; then a
# checkpoint save, a resume from it and two more steps with a second save. What sft_step.py measures in
# isolation, this runs through the launcher (its samples/s is the same step shape's).
#
#   source benchmarks/gpu/device_env.sh              # carried: main-site, sft-site
#   bash benchmarks/gpu/sft_worker_run.sh DATASET STATS OUT [LAYERS=4] [STEPS=8] [MICRO=16] [EPISODES=0,1]
#   PRESET=tiny bash benchmarks/gpu/sft_worker_run.sh DATASET STATS OUT - 40 32 0-39   # the tiny preset instead
#
#   LOSS_CHECK=1 bash benchmarks/gpu/sft_worker_run.sh ...   # then the same STEPS again in fp32 and per-sample
#   RESUME=0 bash benchmarks/gpu/sft_worker_run.sh ...       # run A only (a rate), its closing save in RAM, deleted
#
# LOSS_CHECK=1: after the resume, two more runs of run A's STEPS from the same random weights, data order
# and noise (same seed), their closing save in RAM and deleted: `actor.model.precision=fp32` and `actor.max_tokens_per_pack=null`
# (one transformer call per sample). The summary prints each run's per-step loss, action loss and grad
# norm side by side: whether a loss spike is bf16's, packing's, or the recipe's on random weights.
#
# DATASET/STATS: a LeRobot v3 LIBERO dataset and its action stats (toolkits/libero/record_demos.py,
# toolkits/cosmos3/compute_action_stats.py); EPISODES of it go through the latent cache (the Nano VAE runs
# once per sample). OUT receives both runs' log directories and a summary. Disk: one checkpoint of a
# 4-layer Nano-width model is ~41 GiB (full weights, EMA, resume state) and the device has 64 GiB, so the
# first run's checkpoint goes to $RLINF_DEVICE_TMP (default /tmp) and the resumed run's to /dev/shm (RAM);
# both are deleted at the end. SFT_WORKER_ARGS: extra Hydra overrides for both runs (e.g. a CPU rehearsal).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
DATASET="${1:?usage: $0 DATASET STATS OUT [LAYERS] [STEPS] [MICRO] [EPISODES]}"
STATS="${2:?stats json}"
OUT="${3:?output directory}"
LAYERS="${4:-4}"
STEPS="${5:-8}"
MICRO="${6:-16}"
EPISODES="${7:-0,1}"
PY="${RLINF_DEVICE_PYTHON:-$(command -v python3)}"
TMP="${RLINF_DEVICE_TMP:-/tmp}"
PRESET="${PRESET:-nano}"
[ "$PRESET" = nano ] || LAYERS=""  # other presets keep their own depth
MODEL="$TMP/cosmos3_${PRESET}${LAYERS:+_${LAYERS}l}"
CKPT_A="$TMP/sft_worker_ckpt"
[ "${RESUME:-1}" = 1 ] || CKPT_A=/dev/shm/sft_worker_ckpt  # only a rate: the closing save goes to RAM
CKPT_B="${SFT_RESUME_CKPT_DIR:-/dev/shm/sft_worker_ckpt}"
NAME="${PRESET}${LAYERS:+${LAYERS}l}_mb${MICRO}"
mkdir -p "$OUT"
EPISODES="$("$PY" -c "import sys; from rlinf_cosmos3.id_lists import parse_id_list; print(','.join(map(str, parse_id_list(sys.argv[1:], 'EPISODES'))))" "$EPISODES")"

if [ "$PRESET" != nano ]; then
  [ -f "$MODEL/model_index.json" ] || "$PY" toolkits/cosmos3/make_tiny_model.py --preset "$PRESET" --out "$MODEL"
elif [ ! -f "$MODEL/transformer/config.json" ] || ! ls "$MODEL"/transformer/*.safetensors >/dev/null 2>&1; then
  echo "[sft_worker_run] writing a ${LAYERS}-layer Nano-width model with random weights to $MODEL"
  "$PY" toolkits/cosmos3/make_tiny_model.py --preset nano --num-layers "$LAYERS" --materialize-on cuda \
    --out "$MODEL" --overwrite
fi
common=(cluster.num_gpus_per_node=1 cluster.cpus_per_rank=8 runner.experiment_name="$NAME" runner.log_interval=1
        actor.micro_batch_size="$MICRO" actor.global_batch_size="$MICRO" actor.optim.lr_warmup_steps=2
        actor.optim.total_training_steps=$((STEPS + 2)) actor.model.model_path="$MODEL"
        actor.model.activation_checkpointing=false data.dataset.root="$DATASET" data.dataset.stats_path="$STATS"
        data.dataset.episodes="[$EPISODES]" data.latent_cache_dir="$TMP/sft_worker_latents_${NAME}" data.num_workers=8)
rm -rf "$CKPT_A" "$CKPT_B"
trap 'rm -rf "$CKPT_A" "$CKPT_B"' EXIT

start=$(date +%s)
echo "[sft_worker_run] == run A: $STEPS steps, save"
PYTHON="$PY" bash examples/sft/run_vla_sft.sh libero_sft_cosmos3 "${common[@]}" \
  runner.max_steps="$STEPS" runner.save_interval="$STEPS" runner.logs_dir="$OUT/logs_a" runner.log_path="$CKPT_A" \
  ${SFT_WORKER_ARGS:-}
echo "[sft_worker_run] run A: exit 0 after $(( $(date +%s) - start )) s"
step_a="$CKPT_A/$NAME/checkpoints/global_step_$STEPS"
du -sh "$step_a"/* "$step_a"/actor/* 2>/dev/null | tee "$OUT/checkpoint_sizes.txt"

runs=(logs_a)
if [ "${RESUME:-1}" = 1 ]; then
  start=$(date +%s)
  echo "[sft_worker_run] == run B: resume from $step_a, 2 more steps, save"
  PYTHON="$PY" bash examples/sft/run_vla_sft.sh libero_sft_cosmos3 "${common[@]}" \
    runner.max_steps=$((STEPS + 2)) runner.save_interval=$((STEPS + 2)) runner.logs_dir="$OUT/logs_b" \
    runner.log_path="$CKPT_B" runner.resume_dir="$step_a" ${SFT_WORKER_ARGS:-}
  echo "[sft_worker_run] run B: exit 0 after $(( $(date +%s) - start )) s"
  ls "$CKPT_B/$NAME/checkpoints"
  runs+=(logs_b)
fi
rm -rf "$CKPT_A" "$CKPT_B"  # free the disk before anything else runs

if [ "${LOSS_CHECK:-0}" = 1 ]; then
  for check in fp32:actor.model.precision=fp32 per_sample:actor.max_tokens_per_pack=null; do
    label="${check%%:*}"; override="${check#*:}"
    start=$(date +%s)
    echo "[sft_worker_run] == loss check $label: $STEPS steps, $override (its closing save goes to /dev/shm, then deleted)"
    PYTHON="$PY" bash examples/sft/run_vla_sft.sh libero_sft_cosmos3 "${common[@]}" "$override" \
      runner.max_steps="$STEPS" runner.logs_dir="$OUT/logs_$label" \
      runner.log_path=/dev/shm/sft_worker_check ${SFT_WORKER_ARGS:-}
    echo "[sft_worker_run] loss check $label: exit 0 after $(( $(date +%s) - start )) s"
    rm -rf /dev/shm/sft_worker_check  # the launcher always saves its last step: RAM, not the disk
    runs+=("logs_$label")
  done
fi

# Steady rate: run A's steps after the first two (compilation, allocator warm-up), median and mean.
"$PY" - "$OUT" "$STEPS" "${runs[@]}" <<'EOF' | tee "$OUT/summary.txt"
import re, statistics, sys
from pathlib import Path
out, steps = Path(sys.argv[1]), int(sys.argv[2])
for run in sys.argv[3:]:
    (log,) = (out / run).glob("*/run_embodiment.log")
    rows = [dict(re.findall(r"(\w+)=([-\d.e+]+)", m.group(1))) | {"step": int(m.group(0).split()[1].split("/")[0])}
            for m in re.finditer(r"step \d+/\d+ (.*)", log.read_text())]
    later = [r for r in rows if r["step"] > 2] or rows
    steady = [float(r["samples_per_s"]) for r in later]
    # the mean counts every step's time (an epoch boundary's slow step too); the median hides it
    mean = sum(float(r["samples_per_s"]) * float(r["step_time_s"]) for r in later) / sum(float(r["step_time_s"]) for r in later)
    print(f"{run}: steps {[r['step'] for r in rows]}")
    for key in ("loss", "action_loss", "grad_norm"):
        print(f"{run}: {key} {[round(float(r[key]), 3) for r in rows if key in r]}")
    print(f"{run}: step_time_s {[round(float(r['step_time_s']), 3) for r in rows]}")
    print(f"{run}: samples/s median {statistics.median(steady):.2f}, mean {mean:.2f} (steps > 2), peak GiB "
          f"{max(float(r['peak_memory_gb']) for r in rows):.1f}")
EOF
