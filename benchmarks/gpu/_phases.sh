# Sourced by the phase scripts (learning_proof.sh, rl_proof.sh) after `cd` to the repository root:
#
#   source benchmarks/gpu/_phases.sh && phases_init NAME DEFAULT_PHASES "$@"
#
# sets WORK (the first argument, made and absolute), PHASES (the second, or DEFAULT_PHASES), PY and PYTHON (the
# interpreter: $RLINF_DEVICE_PYTHON, else the repository's .venv, else python3; the launchers read PYTHON) and TIMES
# ($WORK/phase_times.txt), and gives say, phase, timed and hydra_list.

phases_init() {  # phases_init NAME DEFAULT_PHASES WORK [PHASES]
  _PHASES_NAME="$1"
  WORK="${3:?usage: $0 WORK [$2]}"
  PHASES=",${4:-$2},"
  mkdir -p "$WORK"
  WORK="$(cd "$WORK" && pwd)"
  if [ -n "${RLINF_DEVICE_PYTHON:-}" ]; then PY="$RLINF_DEVICE_PYTHON"
  elif [ -x "$PWD/.venv/bin/python" ]; then PY="$PWD/.venv/bin/python"
  else PY="$(command -v python3)"; fi
  export PYTHON="$PY"  # run_vla_sft.sh / run_vla_rl.sh / run_eval.sh use it
  TIMES="$WORK/phase_times.txt"
}
say() { echo "[$_PHASES_NAME $(date +%H:%M:%S)] $*"; }
phase() { case "$PHASES" in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
timed() {  # timed NAME CMD...: run, append the wall time to $TIMES
  local name="$1" t0; shift; t0=$(date +%s)
  "$@"
  echo "$name $(( $(date +%s) - t0 )) s" | tee -a "$TIMES"
}
# ids, lists and ranges ("0-9", "1,4,8", several words) -> a Hydra list "[0,1,...]"
hydra_list() { "$PY" -c "import sys; from rlinf_cosmos3.id_lists import parse_id_list; print('[' + ','.join(map(str, parse_id_list(sys.argv[1:], 'ids'))) + ']')" "$@"; }
