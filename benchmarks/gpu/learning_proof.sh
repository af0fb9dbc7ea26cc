#!/usr/bin/env bash
# The learning proof: a Cosmos3 policy trained by this project succeeds in LIBERO. Only the project's own
# entry points run, in order, on one GPU (one LIBERO task, or one model for several; docs/learning_proof.md):
#
#   record   toolkits/libero/record_demos.py: scripted demonstrations of $LP_SUITE task(s) $LP_TASK on the
#            training init states ($LP_TRAIN_STATES), two each, every one with its own grasp approach and place
#            point (--place-jitter 0.03 --approach-jitter 0.03 --repeats 2), real simulator -> LeRobot v3
#            dataset (skipped when $WORK/demos exists: a recording appears there only complete; an interrupted
#            one is continued from $WORK/demos.partial by the next call)
#   prepare  toolkits/cosmos3/compute_action_stats.py on the training episodes (init states $LP_TRAIN_STATES);
#            toolkits/cosmos3/make_tiny_model.py --preset small (random init)
#   train    bash examples/sft/run_vla_sft.sh libero_sft_cosmos3_small (latent cache in $WORK/latents)
#   convert  toolkits/cosmos3/convert_checkpoint.py on the newest checkpoint by step (EMA weights, bf16)
#   eval     bash evaluations/run_eval.sh libero libero_spatial_cosmos3_eval_small (env.eval.suite=$LP_SUITE): the
#            SGLang server on the GPU, 16 real LIBERO envs; init states 0..49 with policy seed 42, then init
#            states $LP_EXTRA_STATES (default: 0..49 again) with each seed of $LP_EXTRA_SEEDS; then the
#            language controls when asked: each $LP_SWAP pair "B:A" runs task B (its instruction, its goal)
#            from task A's init states $LP_SWAP_STATES; $LP_ABLATE set runs every task on the held-out
#            states with that constant instruction instead of its own (e.g. LP_ABLATE="" -> none)
#   report   toolkits/eval/success_report.py (trained vs held-out, and swapped / ablated when run, Wilson 95 %
#            intervals) -> $WORK/report.json, and whether each target is met (one task: trained >= 90 %, held
#            out >= 60 %; several: the suite's targets in docs/learning_proof.md, per task and on average);
#            toolkits/plot_training.py (every SFT run, a resumed training joined) -> $WORK/training_curves.png;
#            the first success's and the first failure's video of the first eval -> $WORK/success.mp4, failure.mp4
#            (and with LP_SWAP the first swapped success -> $WORK/swap.mp4);
#            toolkits/eval/episode_sheet.py: every failure of those evals, a row of frames each -> $WORK/failures.jpg
#
#   bash benchmarks/gpu/learning_proof.sh WORK [PHASES]     # PHASES: comma list (default: all of the above)
#
# On the offline GPU device, source benchmarks/gpu/device_env.sh and benchmarks/gpu/libero_env.sh first (they
# set PYTHONPATH, RLINF_COSMOS3_SGLANG_PYTHON and RLINF_COSMOS3_LIBERO_PYTHON); on a machine with the project's
# three environments (requirements/install.sh) nothing else is needed. Knobs (environment):
#   LP_SUITE (libero_spatial; libero_goal, libero_object: one scene / many objects, for the language proof)
#   LP_TASK (0; several - "0-3", "0,2" - train one model on those tasks and evaluate each)
#   LP_SFT_CONFIG (libero_sft_cosmos3_small; libero_goal_sft_cosmos3_small: the recipe for several goal tasks)
#   LP_SWAP ("" ; e.g. "1:0 2:0": task 1 and task 2 each from task 0's init states)  LP_SWAP_STATES (0-9)
#   LP_ABLATE (unset: no ablation; set, even to "", the constant instruction of the ablation eval, run without videos)
#   LP_ABLATE_STATES (the held-out init states of the ablation eval; default LP_HELD_OUT, e.g. 40-44 for half)
#   LP_EVAL_PARALLEL (0; 1: all the evals at once, their start-ups overlapping; output in $WORK/eval_NAME.out)
#   LP_TRAIN_REPEATS (all; e.g. 0: of several recorded demonstrations per init state, train on the first only)
#   LP_TRAIN_STATES (0-39)  LP_HELD_OUT (40-49)  LP_STEPS, LP_SAVE_INTERVAL (the recipe's: 3520, 880)
#   LP_MAX_TRAIN_S (training stops cleanly, with a checkpoint, after this many seconds of training: counted
#   from the first step, so a call with a time limit must also fit ~60 s of set-up, ~100 s to build the
#   latent cache the first time, and the save + conversion; keep LP_SAVE_INTERVAL < LP_STEPS so a killed
#   call still leaves a checkpoint)  LP_RECORD_ENVS (16)
#   LP_EXTRA_SEEDS ("43 44"; "" for none)  LP_EXTRA_STATES (the init states evaluated again with each extra
#   seed; default LP_EVAL_STATES, e.g. 40-49 for the held-out ones only)  LP_EVAL_STATES (0-49)  LP_EVAL_ENVS (16)  LP_SFT_ARGS (extra Hydra overrides for SFT)
#   LP_CONVERTED ($WORK/cosmos3_small_sft: the converted model the convert phase writes and the evals serve; e.g. an
#   RL run's converted checkpoint, evaluated as the SFT one with LP_EVAL_NAME set so the SFT evals are kept)
#   LP_EVAL_ARGS (extra Hydra overrides for eval)  LP_EVAL_NAME (suffix of the eval and report outputs, so an
#   eval variant keeps the others: LP_EVAL_NAME=_ol8 LP_EVAL_ARGS=env.eval.open_loop_steps=8 -> logs/eval_*_ol8,
#   report_ol8.json)  LP_RECORD_ARGS (record_demos.py flags after the suite, task, init states and output;
#   default "--place-jitter 0.03 --approach-jitter 0.03 --repeats 2", the data of the run that met the
#   targets; "" for one clean demonstration per init state; e.g. "--action-noise 0.1 --recorded-action clean":
#   perturbed demonstrations with corrective labels)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
# WORK, PHASES, PY/PYTHON, TIMES; say, phase, timed, hydra_list
source benchmarks/gpu/_phases.sh && phases_init learning_proof record,prepare,train,convert,eval,report "$@"

SUITE="${LP_SUITE:-libero_spatial}"
TASK="${LP_TASK:-0}"
TRAIN_STATES="${LP_TRAIN_STATES:-0-39}"
HELD_OUT="${LP_HELD_OUT:-40-49}"
SFT_CONFIG="${LP_SFT_CONFIG:-libero_sft_cosmos3_small}"
recipe() { sed -n "s/^  $1: *\([0-9A-Za-z_]*\).*/\1/p" "examples/sft/config/$SFT_CONFIG.yaml" | head -1; }  # runner.<key>
[ -f "examples/sft/config/$SFT_CONFIG.yaml" ] || { echo "LP_SFT_CONFIG: no examples/sft/config/$SFT_CONFIG.yaml" >&2; exit 2; }
STEPS="${LP_STEPS:-$(recipe max_steps)}"
SAVE_INTERVAL="${LP_SAVE_INTERVAL:-$(recipe save_interval)}"
RECORD_ARGS="${LP_RECORD_ARGS---place-jitter 0.03 --approach-jitter 0.03 --repeats 2}"  # set but empty: clean demos
EXTRA_SEEDS="${LP_EXTRA_SEEDS-43 44}"  # set but empty: no extra seeds
DEMOS="$WORK/demos"
STATS="$WORK/libero_native_frame_wise_relative_rot6d.json"
MODEL="$WORK/cosmos3_small"
CONVERTED="${LP_CONVERTED:-$WORK/cosmos3_small_sft}"  # what the convert phase writes and the evals serve
LOGS="$WORK/logs"
CKPTS="$WORK/sft/$(recipe experiment_name)/checkpoints"

# Episode indexes of the dataset whose recorded init state is in the given list (meta/episodes keeps it).
episodes_of_states() {
  "$PY" - "$DEMOS" "$@" <<'EOF'
import os
import sys
from pathlib import Path

import pyarrow.parquet as pq

from rlinf_cosmos3.id_lists import parse_id_list

root, wanted = Path(sys.argv[1]), set(parse_id_list(sys.argv[2:], "init states"))
repeats = os.environ.get("LP_TRAIN_REPEATS", "")
columns = ["episode_index", "init_state_id", "success"] + (["repeat"] if repeats else [])
rows = pq.ParquetDataset(sorted((root / "meta" / "episodes").rglob("*.parquet"))).read(columns=columns).to_pylist()
keep = set(parse_id_list([repeats], "LP_TRAIN_REPEATS")) if repeats else None
print(",".join(str(r["episode_index"]) for r in sorted(rows, key=lambda r: r["episode_index"])
               if r["init_state_id"] in wanted and r["success"] and (keep is None or r["repeat"] in keep)))
EOF
}

if phase record && [ ! -d "$DEMOS" ]; then
  say "recording $SUITE task(s) $TASK, init states $TRAIN_STATES ($RECORD_ARGS) -> $DEMOS"
  # ids, never a count: the recorder reads a lone integer N as "the first N" ("7," is init state 7)
  # shellcheck disable=SC2086
  record_states="$(hydra_list $TRAIN_STATES | tr -d '[]'),"
  # shellcheck disable=SC2086
  timed record "$PY" toolkits/libero/record_demos.py --suite "$SUITE" --task-ids $TASK \
    --init-states "$record_states" --out "$DEMOS" --repo-id local/learning_proof --num-envs "${LP_RECORD_ENVS:-16}" \
    --summary-json "$WORK/record_summary.json" --no-progress $RECORD_ARGS
fi

TRAIN_EPISODES=""
if phase prepare || phase train; then
  TRAIN_EPISODES="$(episodes_of_states "$TRAIN_STATES")"
  [ -n "$TRAIN_EPISODES" ] || { say "no successful demonstration of init states $TRAIN_STATES in $DEMOS"; exit 1; }
  say "training episodes (init states $TRAIN_STATES): $TRAIN_EPISODES"
fi
if phase prepare; then
  timed stats "$PY" toolkits/cosmos3/compute_action_stats.py --data "$DEMOS" --out "$STATS" --episodes "$TRAIN_EPISODES"
  timed model "$PY" toolkits/cosmos3/make_tiny_model.py --preset small --out "$MODEL" --seed 0 --overwrite
fi

if phase train; then
  say "SFT: $STEPS steps"
  # shellcheck disable=SC2086
  timed train bash examples/sft/run_vla_sft.sh "$SFT_CONFIG" \
    actor.model.model_path="$MODEL" data.dataset.root="$DEMOS" data.dataset.stats_path="$STATS" \
    data.dataset.episodes="[$TRAIN_EPISODES]" data.latent_cache_dir="$WORK/latents" \
    runner.log_path="$WORK/sft" runner.logs_dir="$LOGS/sft" runner.max_steps="$STEPS" \
    runner.save_interval="$SAVE_INTERVAL" runner.max_checkpoints_to_keep=2 \
    runner.max_wall_time_s="${LP_MAX_TRAIN_S:-null}" actor.optim.total_training_steps="$STEPS" ${LP_SFT_ARGS:-}
fi

if phase convert; then
  # The checkpoints directory: the converter takes its newest complete checkpoint by step number
  # (a name sort put global_step_880 after global_step_1760).
  timed convert "$PY" toolkits/cosmos3/convert_checkpoint.py --src "$CKPTS" --base "$MODEL" --out "$CONVERTED" \
    --use-ema-weights --dtype bf16 --overwrite
fi

SUFFIX="${LP_EVAL_NAME:-}"
run_eval() {  # run_eval NAME SEED STATES TASKS [OVERRIDES...]
  local name="$1" seed="$2" states="$3" tasks="$4"; shift 4
  # shellcheck disable=SC2086
  timed "eval_$name$SUFFIX" bash evaluations/run_eval.sh libero libero_spatial_cosmos3_eval_small \
    env.eval.suite="$SUITE" runner.experiment_name="${SUITE}_cosmos3_eval_small" \
    rollout.model.model_path="$CONVERTED" rollout.model.action_stats_path="$STATS" rollout.model.seed="$seed" \
    env.eval.task_ids="$(hydra_list $tasks)" env.eval.init_state_ids="$(hydra_list "$states")" \
    env.eval.total_num_envs="${LP_EVAL_ENVS:-16}" runner.logs_dir="$LOGS/eval_$name$SUFFIX" \
    "$@" ${LP_EVAL_ARGS:-}
}
SWAP_STATES="${LP_SWAP_STATES:-0-9}"
# "B:A B2:A2" -> the Hydra dict {B:A,B2:A2} and the instructed tasks B,B2
swap_dict() { local pairs="${LP_SWAP// /,}"; echo "{$pairs}"; }
swap_tasks() { local p out=""; for p in $LP_SWAP; do out="$out${out:+,}${p%%:*}"; done; echo "$out"; }
# LP_EVAL_PARALLEL=1: every eval at once, each with its own Ray, SGLang server (ports never collide:
# workers/rollout/ports.py) and envs, its output in $WORK/eval_NAME.out; the host's cores are shared, so
# the start-ups (Ray, server, envs: ~90 s each on a 16-core H100 host) overlap instead of adding up.
EVAL_PIDS=()
eval_job() {  # eval_job NAME ARGS...: run_eval now, or in the background with LP_EVAL_PARALLEL=1
  local name="$1"
  if [ "${LP_EVAL_PARALLEL:-0}" = 1 ]; then
    say "eval $name$SUFFIX started in the background (output: $WORK/eval_$name$SUFFIX.out)"
    run_eval "$@" >"$WORK/eval_$name$SUFFIX.out" 2>&1 &
    EVAL_PIDS+=("$!:$name")
  else
    run_eval "$@"
  fi
}
if phase eval; then
  eval_job all_seed42 42 "${LP_EVAL_STATES:-0-49}" "$TASK"
  for seed in $EXTRA_SEEDS; do
    eval_job "extra_seed$seed" "$seed" "${LP_EXTRA_STATES:-${LP_EVAL_STATES:-0-49}}" "$TASK"
  done
  if [ -n "${LP_SWAP:-}" ]; then  # the same physical starts under another instruction
    eval_job swap_seed42 42 "$SWAP_STATES" "$(swap_tasks)" "++env.eval.init_states_from_task=$(swap_dict)"
  fi
  if [ -n "${LP_ABLATE+set}" ]; then  # every task's held-out episodes with one constant instruction
    # no videos: nothing reads them (the failure sheet leaves the ablation out), and rendering every step for
    # them costs simulator time in its ~N x cap steps of mostly failed episodes
    eval_job ablate_seed42 42 "${LP_ABLATE_STATES:-$HELD_OUT}" "$TASK" env.eval.instruction_override="'$LP_ABLATE'" \
      env.eval.save_video=none
  fi
  failed=""
  for job in "${EVAL_PIDS[@]}"; do  # each one's result line and success rate, then whether it failed
    pid="${job%%:*}"; name="${job#*:}"
    if wait "$pid"; then say "eval $name$SUFFIX done"; else failed="$failed $name$SUFFIX"; fi
    grep -E "eval: summary:|^eval_$name" "$WORK/eval_$name$SUFFIX.out" | tail -n 3 || true
  done
  [ -z "$failed" ] || { say "eval(s) failed:$failed (their output: $WORK/eval_*.out)"; exit 1; }
fi

if phase report; then
  groups=()
  # newest run directory under a logs dir, or nothing (no run there: ls fails, which pipefail would make fatal)
  latest() { ls -dt "$1"/*/ 2>/dev/null | head -1 | sed 's:/$::' || true; }
  eval_runs=()
  add_eval() {  # add_eval NAME SEED: the newest run of logs/NAME to both groups, or say the seed is left out
    local run; run=$(latest "$LOGS/$1$SUFFIX")
    if [ -z "$run" ]; then say "no eval run in $LOGS/$1$SUFFIX: seed $2 is not in the report"; return 0; fi
    # each group takes the states of its own kind that the run evaluated
    groups+=(--group trained "$run:$TRAIN_STATES" --group held_out "$run:$HELD_OUT")
    eval_runs+=("$run")
  }
  add_eval eval_all_seed42 42
  for seed in $EXTRA_SEEDS; do add_eval "eval_extra_seed$seed" "$seed"; done
  first=$(latest "$LOGS/eval_all_seed42$SUFFIX")
  # the language controls: swapped starts, and the held-out episodes under one constant instruction
  swap_run=$(latest "$LOGS/eval_swap_seed42$SUFFIX")
  [ -n "$swap_run" ] && { groups+=(--group swap "$swap_run"); eval_runs+=("$swap_run"); }
  ablate_run=$(latest "$LOGS/eval_ablate_seed42$SUFFIX")
  if [ -n "$ablate_run" ] && [ ${#groups[@]} -gt 0 ]; then
    groups+=(--group ablated "$ablate_run:$HELD_OUT" --ablation held_out ablated)
  fi
  if [ ${#groups[@]} -gt 0 ]; then
    "$PY" toolkits/eval/success_report.py --out "$WORK/report$SUFFIX.json" "${groups[@]}"
    # the learning proof's targets (docs/learning_proof.md), one line each: met or not, with the interval
    "$PY" toolkits/eval/proof_targets.py "$WORK/report$SUFFIX.json" --suite "$SUITE"
  fi
  # every failure of every eval run above, a row of frames each (where the policy goes wrong, at a glance)
  if [ ${#eval_runs[@]} -gt 0 ]; then
    "$PY" toolkits/eval/episode_sheet.py "${eval_runs[@]}" --select failures --out "$WORK/failures$SUFFIX.jpg" \
      || say "no failure sheet (no failed episode with a video)"
  fi
  # one video of a success and one of a failure (the first of each in the first eval run), and with the swap
  # control the first success of a swapped start (the instructed task done from another task's state) -> $WORK/*.mp4
  [ -n "$first" ] && "$PY" - "$first" "$WORK" "$SUFFIX" "${swap_run:-}" <<'EOF'
import shutil
import sys
from pathlib import Path

from rlinf_cosmos3.tracking.results_file import episode_video, read_results

first, work, suffix, swap = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
wanted = [("success", first, True), ("failure", first, False)] + ([("swap", Path(swap), True)] if swap else [])
for name, run, want in wanted:
    rows = read_results(run)
    row = next((r for r in rows if r["success_once"] is want and episode_video(run, r)), None)
    if row is None:
        print(f"[learning_proof] no {name} video in {run}")
        continue
    dst = shutil.copyfile(episode_video(run, row), work / f"{name}{suffix}.mp4")
    start = row.get("init_state_task_id")
    start = f" of task {start}" if start not in (None, row["task_id"]) else ""
    print(f"[learning_proof] {name} video: task {row['task_id']}, init state {row['trial_id']}{start}, {row['steps']} steps, "
          f"{Path(dst).stat().st_size / 2**20:.2f} MiB -> {dst}")
EOF
  # every SFT run directory that logged, oldest first: a training resumed in a later call continues the curves (a
  # launch refused for its config logged nothing and is left out; a curve that cannot be drawn costs no result)
  mapfile -t sft_runs < <(ls -dtr "$LOGS"/sft/*/tensorboard 2>/dev/null | sed 's:/tensorboard$::')
  if [ ${#sft_runs[@]} -gt 0 ]; then
    "$PY" toolkits/plot_training.py "${sft_runs[@]}" --out "$WORK/training_curves.png" || say "no training curves"
  fi
  say "phase wall times:"; cat "$TIMES" 2>/dev/null || true
fi
say "done: $WORK"
