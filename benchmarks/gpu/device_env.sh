# Source on the GPU device, from the repository root, after carrying the archives that
# benchmarks/gpu/pack_device_env.sh wrote into .devpkg/:
#
#   source benchmarks/gpu/device_env.sh
#
# For each .devpkg/<name>-site.tar.xz carried (main, sft, sglang, sglkernel) it unpacks the archive into
# /tmp/site-<name> (skipped when that archive is already unpacked there, e.g. on a machine still warm
# from the last call; a /tmp/site-<name> left by an earlier call is used when the archive was not
# carried this time). Then:
#   - PYTHONPATH = repo root : /tmp/site-main [: /tmp/site-sft]  for the main code (python3 is the image's);
#   - /tmp/sglang-env/bin/python: runs python3 with PYTHONPATH=[/tmp/site-sglkernel:]/tmp/site-sglang only
#     (the server's own diffusers 0.37 must not meet ours), and /tmp/sglang-env/bin/sglang beside it, the
#     console script that rollout.sglang needs next to its interpreter; RLINF_COSMOS3_SGLANG_PYTHON
#     points at that interpreter;
#   - NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 (NVLink multicast off).
#
# Settings: RLINF_DEVPKG (archive folder, default <repo>/.devpkg), RLINF_DEVICE_PYTHON (interpreter,
# default the python3 on PATH), RLINF_DEVICE_TMP (where site-*/ and sglang-env/ go; default /tmp),
# RLINF_SGLANG_ATTENTION_BACKEND (read by the sglang script when a server starts: what it adds to
# `sglang serve` when no --attention-backend is given; default torch_sdpa, since neither carried
# sgl_kernel has FlashAttention 3, SGLang's default on Hopper; empty: add nothing).
#
# It is sourced, so it does not `set -euo pipefail` in your shell: every step checks itself and the
# script returns 1 with a message on the first failure.

_rlinf_device_env() {
  local root pkg py base name archive site stamp want unpacked=() reused=() missing_glibc=""
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)" || return 1
  pkg="${RLINF_DEVPKG:-$root/.devpkg}"
  py="${RLINF_DEVICE_PYTHON:-$(command -v python3)}"
  base="${RLINF_DEVICE_TMP:-/tmp}"
  if [ -z "$py" ] || [ ! -x "$py" ]; then
    echo "[device_env] ERROR: no python3 found (set RLINF_DEVICE_PYTHON)" >&2; return 1
  fi
  # An absolute path, symlinks kept: the image's python3 is a venv's (/opt/torch/.venv/bin/python3),
  # and resolving the link would leave the venv and its torch behind.
  case "$py" in /*) ;; *) py="$PWD/$py" ;; esac

  for name in main sft sglang sglkernel; do
    archive="$pkg/$name-site.tar.xz"
    site="$base/site-$name"
    if [ -f "$archive" ]; then
      want="$(sha256sum "$archive" | cut -c1-16)" || return 1
      stamp="$(cat "$site/.rlinf-archive" 2>/dev/null)"
      if [ "$stamp" = "$want" ]; then
        reused+=("$name")
      else
        rm -rf "$site" "$site.partial" && mkdir -p "$site.partial" || return 1
        if ! tar -C "$site.partial" -xJf "$archive"; then
          echo "[device_env] ERROR: could not unpack $archive" >&2; rm -rf "$site.partial"; return 1
        fi
        echo "$want" >"$site.partial/.rlinf-archive" && mv "$site.partial" "$site" || return 1
        unpacked+=("$name")
      fi
    elif [ -f "$site/.rlinf-archive" ]; then
      reused+=("$name")
    fi
  done
  if [ ! -d "$base/site-main" ]; then
    echo "[device_env] ERROR: no main-site archive in $pkg and nothing unpacked in $base/site-main" \
         "(run benchmarks/gpu/pack_device_env.sh here and carry .devpkg)" >&2
    return 1
  fi

  local pp="$root:$base/site-main"
  [ -d "$base/site-sft" ] && pp="$pp:$base/site-sft"
  export PYTHONPATH="$pp"

  # NVLink multicast stays off on these hosts (KINDS.md); the servers and Ray workers inherit it.
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

  local server_note="no sglang-site: SGLang server unavailable"
  if [ -d "$base/site-sglang" ]; then
    local env_dir="$base/sglang-env" spp="$base/site-sglang" kernels="pure-torch sgl_kernel stand-in" ldpath=""
    if [ -d "$base/site-sglkernel" ]; then
      spp="$base/site-sglkernel:$spp"
      kernels="sgl_kernel 0.4.3 (sm90)"
      # Its ops link libnuma.so.1: use the carried copy only where the system has none.
      ldconfig -p 2>/dev/null | grep -q 'libnuma\.so\.1 ' || ldpath="$base/site-sglkernel/.libs"
    fi
    # sglang 0.5.23's wheel is manylinux_2_34: it needs glibc >= 2.34.
    "$py" -c 'import platform, sys; v = platform.libc_ver()[1]; sys.exit(0 if tuple(map(int, v.split(".")[:2])) >= (2, 34) else 1)' \
      2>/dev/null || missing_glibc=" WARNING: glibc < 2.34, the sglang wheel needs 2.34"
    mkdir -p "$env_dir/bin" || return 1
    local ld_line=""
    [ -n "$ldpath" ] && ld_line="export LD_LIBRARY_PATH=$ldpath\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
    cat >"$env_dir/bin/python" <<EOF
#!/bin/bash
# The SGLang server environment carried by rlinf-cosmos3 (benchmarks/gpu/device_env.sh).
export PYTHONPATH=$spp
$ld_line
exec $py "\$@"
EOF
    cat >"$env_dir/bin/sglang" <<EOF
#!$env_dir/bin/python
# sglang console script of the carried SGLang environment (benchmarks/gpu/device_env.sh).
import os
import sys

from sglang.cli.main import main

backend = os.environ.get("RLINF_SGLANG_ATTENTION_BACKEND", "torch_sdpa")
if backend and sys.argv[1:2] == ["serve"] and not any(
        a == "--attention-backend" or a.startswith("--attention-backend=") for a in sys.argv):
    # Neither carried sgl_kernel has FlashAttention 3, SGLang's default on Hopper.
    print(f"[sglang-env] adding --attention-backend {backend} (no FA3 here)", file=sys.stderr, flush=True)
    sys.argv += ["--attention-backend", backend]
if __name__ == "__main__":
    sys.exit(main())
EOF
    chmod +x "$env_dir/bin/python" "$env_dir/bin/sglang" || return 1
    export RLINF_COSMOS3_SGLANG_PYTHON="$env_dir/bin/python"
    server_note="SGLang: RLINF_COSMOS3_SGLANG_PYTHON=$env_dir/bin/python ($kernels)$missing_glibc"
  fi

  echo "[device_env] python3=$py; unpacked: ${unpacked[*]:-none}; reused: ${reused[*]:-none};" \
       "PYTHONPATH=$PYTHONPATH"
  echo "[device_env] $server_note; NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1"
}

_rlinf_device_env
_rlinf_device_env_rc=$?
unset -f _rlinf_device_env
if [ "$_rlinf_device_env_rc" -ne 0 ]; then
  unset _rlinf_device_env_rc
  return 1 2>/dev/null || exit 1
fi
unset _rlinf_device_env_rc
