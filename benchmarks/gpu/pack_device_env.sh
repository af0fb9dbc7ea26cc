#!/usr/bin/env bash
# Build the site-packages archives that the GPU device (no internet) needs beyond its image.
#
#   bash benchmarks/gpu/pack_device_env.sh                  # -> .devpkg/{main,sft,sglang,sglkernel}-site.tar.xz
#   bash benchmarks/gpu/pack_device_env.sh --only main,sglang
#   bash benchmarks/gpu/pack_device_env.sh --only main,sft --out /tmp/devpkg   # archives elsewhere
#
# The device's python3 (3.12, x86_64) already holds torch 2.11 (cu130), triton 3.6, the nvidia-* and
# cuda-* wheels, transformers 5.17, numpy 2.5, tokenizers, safetensors, accelerate, aiohttp, httpx,
# msgpack, pyyaml, pillow, psutil, uvloop, pandas, pyarrow, scipy, tensorboard, torchvision 0.26, ...
# (/work/.library/device/KINDS.md). These archives hold only what is missing there; device_env.sh
# unpacks each one carried into /tmp/site-<name>:
#
#   main-site       our main code's serving / eval / Ray path: diffusers 0.42.1, ray 2.60.0 (core only,
#                   binaries stripped), hydra-core + omegaconf + antlr4, jsonschema (+ referencing, rpds).
#   sft-site        what the SFT step adds (rlinf_cosmos3.data imports lerobot at module level, and lerobot
#                   imports PyAV): lerobot 0.6.1, draccus, mergedeep, gymnasium, datasets, multiprocess, dill,
#                   av 15.1 (its cython modules stripped).
#                   Separate because PyAV's bundled FFmpeg is most of its size.
#   sglang-site     the SGLang diffusion server, an environment of its own: sglang 0.5.23 (LLM-only Rust
#                   extensions and tests removed) with the runtime deps the device lacks, pinned as in
#                   requirements/sglang.txt (diffusers 0.37.0, pydantic, fastapi, uvicorn, pyzmq, ...), and
#                   a pure-torch stand-in for sgl_kernel (see SHIM below).
#   sglkernel-site  optional: the real sgl_kernel of sglang-kernel 0.4.3, the last release built against
#                   torch 2.11 (0.4.10, which sglang 0.5.23 names, needs torch 2.14), sm90 (H100/H200) ops
#                   only, plus libnuma.so.1 which they link. No FA3 (its flash_ops is 1 GB): either way the
#                   server runs with --attention-backend torch_sdpa (device_env.sh's sglang script adds it).
#
# Never carried: torch, triton, nvidia-*, cuda-* (the device has them). Needs uv (cp312 manylinux wheels
# are fetched for the device whatever this machine's Python is), strip (binutils) and xz.
#
# Packing never writes to a file it did not create. `uv pip install --target` hard-links files from
# uv's shared cache by default, and every environment built from that cache (.venv included) links the
# very same inodes: stripping such a file in place rewrites ray/_raylet.so under a running Ray. So the
# wheels are unpacked with --link-mode copy (checked: no staged file may have a second link), strip
# works on a private copy that is renamed over the staged name, and every file written into a stage is
# written as a new file (rm/rename only ever drop a stage's own directory entries).
#
# Settings: --out DIR (archive folder, default <repo>/.devpkg), DEVPKG_WORK (staging folder, default
# /tmp/rlinf-devpkg-build), DEVPKG_XZ_LEVEL (xz preset, default -9; e.g. -0 for a quick test pack).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT_DIR="$ROOT/.devpkg"
WORK="${DEVPKG_WORK:-/tmp/rlinf-devpkg-build}"
ONLY="main,sft,sglang,sglkernel"
# cp312 wheels for x86_64; 2_34 because sglang 0.5.23 ships only manylinux_2_34 wheels (glibc >= 2.34).
PLATFORM=(--python-version 3.12 --python-platform x86_64-manylinux_2_34)
XZ_LEVEL="${DEVPKG_XZ_LEVEL:--9}"

die() { echo "[pack] ERROR: $*" >&2; exit 1; }
# shellcheck source=../../requirements/find_uv.sh
source "$ROOT/requirements/find_uv.sh"  # uv where requirements/install.sh put it (~/.local/bin), off PATH
uv_onto_path || die "uv not found (requirements/install.sh installs it; or: pip install uv)"
say() { echo "[pack] $*"; }

# ------------------------------------------------------------------------------------------ versions
# main/sft: the versions .venv resolves requirements/main.txt to (uv pip freeze, 2026-11-29).
MAIN_PKGS=(
  diffusers==0.42.1 ray==2.60.0 hydra-core==1.3.8 omegaconf==2.3.1 antlr4-python3-runtime==4.9.3
  jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1
)
SFT_PKGS=(
  lerobot==0.6.1 draccus==0.11.6 mergedeep==1.3.4 gymnasium==1.4.0 farama-notifications==0.0.6 datasets==4.8.5
  multiprocess==0.70.19 dill==0.4.1 av==15.1.0
)
# sglang: the packages of requirements/sglang.txt that the device image lacks, at that file's pins
# (the device's own transformers 5.17 / numpy 2.5 / torchvision 0.26 / tokenizers serve the CPU server).
# Left out, never imported by `sglang serve` of a diffusion model (measured with PYTHONPROFILEIMPORTTIME):
# IPython's interactive-shell stack (jedi, parso, prompt_toolkit, pexpect, ptyprocess, stack_data,
# pure_eval, executing, asttokens, wcwidth, matplotlib-inline, ipython-pygments-lexers) and tzdata.
SGLANG_NAMES=(
  sglang diffusers addict annotated-types apache-tvm-ffi cache_dit compressed-tensors dill fastapi gguf
  httpcore2 httpx2 imageio-ffmpeg importlib_metadata ipython jiter lazy-importer loguru msgspec openai
  opentelemetry-api orjson partial-json-parser pybase64 pydantic pydantic_core python-multipart pyzmq
  setproctitle sniffio starlette traitlets truststore typing-inspection uvicorn
)
SGL_KERNEL_PKG=sglang-kernel==0.4.3

pin_from_sglang_txt() {  # pin_from_sglang_txt NAME -> NAME==VERSION as requirements/sglang.txt pins it
  local line
  line=$(grep -i -m1 "^$1==" "$ROOT/requirements/sglang.txt") || die "'$1' is not pinned in requirements/sglang.txt"
  echo "$line"
}

fetch() {  # fetch DIR PKG... : the wheels' files, unpacked into DIR as private copies, no dependencies
  local dir="$1"; shift
  # --link-mode copy: uv's default hard-links the shared cache, whose inodes every venv shares.
  uv pip install -q --target "$dir" --link-mode copy "${PLATFORM[@]}" --no-deps "$@" \
    || die "uv could not fetch: $*"
  local linked
  linked=$(find "$dir" -type f -links +1 -print -quit)
  [ -z "$linked" ] || die "uv left hard-linked files in $dir (e.g. $linked): pruning would write through them"
}

# ------------------------------------------------------------------------------------------ pruning
strip_elf() {  # strip_elf FILE...: drop symbol tables / debug info (dynamic symbols stay)
  # On a private copy renamed over FILE: GNU strip rewrites a file with several links in place, and
  # a staged file must never be changed through a link it might share with the uv cache or a venv.
  local f tmp
  for f in "$@"; do
    [ -f "$f" ] || continue
    tmp="$f.pack-strip.tmp"
    rm -f "$tmp"
    cp -p "$f" "$tmp"
    if strip --strip-unneeded "$tmp" 2>/dev/null; then mv -f "$tmp" "$f"; else rm -f "$tmp"; fi
  done
}

common_prune() {  # common_prune DIR: what no import ever reads
  local dir="$1"
  rm -rf "$dir/bin" "$dir/share" "$dir/examples" "$dir/tests" "$dir/pydevd_plugins"
  find "$dir" -depth -type d -name __pycache__ -exec rm -rf {} +
}

prune_main() {
  local dir="$1" ray="$1/ray"
  # Ray libraries we never import (we use ray core: actors, placement groups, ray.util), Java jars, and
  # the dashboard's web client (the dashboard is off: ClusterConfig.include_dashboard=false).
  rm -rf "$ray/jars" "$ray/rllib" "$ray/data" "$ray/serve" "$ray/tune" "$ray/train" "$ray/llm" \
         "$ray/air" "$ray/workflow" "$ray/dashboard/client" "$ray/cpp" "$ray/tests"
  strip_elf "$ray/_raylet.so" "$ray/core/src/ray/raylet/raylet" "$ray/core/src/ray/gcs/gcs_server"
  common_prune "$dir"
}

prune_sft() {
  local dir="$1"
  strip_elf "$dir"/av/*.so "$dir"/av/*/*.so "$dir"/av/*/*/*.so
  common_prune "$dir"
}

prune_sglang() {
  local dir="$1" sg="$1/sglang"
  # The LLM server's Rust extensions (HTTP/gRPC server, radix-tree cache, benchmarks, multimodal
  # preprocessing): ~45 MB of .so that the diffusion server never loads (their .py wrappers stay).
  rm -f "$sg"/srt/rust_extensions/*.so "$sg"/srt/mem_cache/rust_tree_core/*.so
  rm -rf "$sg/test" "$sg/multimodal_gen/test" "$sg/benchmark"
  # imageio-ffmpeg is imported (video outputs) but its 165 MB ffmpeg binary only runs to write videos;
  # the action endpoint writes none. Without it imageio_ffmpeg.get_ffmpeg_exe() raises if ever called.
  rm -rf "$dir/imageio_ffmpeg/binaries"
  common_prune "$dir"
}

# SHIM: SGLang's diffusion layers import a few fused ops from sgl_kernel at module level on CUDA
# (layernorm: rmsnorm, fused_add_rmsnorm; names of LLM-side modules that are imported, never called).
# The stand-in computes the ops the diffusion path calls with plain torch and exports exactly the
# names that `sglang serve` imports (found by importing every module the server loads on a faked
# sm90 CUDA platform with a recording sgl_kernel), so guarded optional imports still see what they
# would see; other names fail to import as with an older sgl_kernel; FA3 fails to import as it does
# in the real package without flash_ops. scalar_type.py is the real one (pure Python).
write_sgl_kernel_shim() {  # write_sgl_kernel_shim DIR KERNEL_WHEEL_DIR
  local pkg="$1/sgl_kernel" real="$2/sgl_kernel"
  rm -rf "$pkg"  # every file below is then a new one (`cat >`/cp onto an existing file write through it)
  mkdir -p "$pkg"
  cp "$real/scalar_type.py" "$pkg/scalar_type.py"
  cat >"$pkg/__init__.py" <<'EOF'
"""Pure-torch stand-in for sglang-kernel's ``sgl_kernel``, written by benchmarks/gpu/pack_device_env.sh.

The real sglang-kernel cannot come along: 0.4.10 (what sglang 0.5.23 names) is built against torch 2.14
and does not link against the device's torch 2.11; 0.4.3 (built against 2.11) is 13.5 MiB of the 64 MiB a
device call carries (sglkernel-site.tar.xz, which shadows this package when carried). SGLang's diffusion
layers call a few fused ops from it on CUDA; they are computed here with plain torch (same maths,
unfused, fp32 accumulation like the kernels). The other names exist because SGLang imports them at module
level; calling one raises NotImplementedError.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

__version__ = "0.4.3+rlinf.torch"
IS_TORCH_STANDIN = True

print("[sgl_kernel] pure-torch stand-in (rlinf-cosmos3 device env): rmsnorm, fused_add_rmsnorm, gemma_*, "
      "*_and_mul in torch; the real sglang-kernel is not installed", file=sys.stderr, flush=True)


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (xf * (weight.float() + 1.0 if gemma else weight.float())).to(x.dtype)


def _into(result: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    if out is None:
        return result
    out.copy_(result)
    return out


def rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None):
    return _into(_rms(input, weight, eps, gemma=False), out)


def gemma_rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None):
    return _into(_rms(input, weight, eps, gemma=True), out)


def _fused_add(input, residual, weight, eps, gemma):
    """In place like the kernel: ``residual += input``, then ``input = rmsnorm(residual)``."""
    summed = input.float() + residual.float()
    residual.copy_(summed.to(residual.dtype))
    input.copy_(_rms(summed, weight, eps, gemma=gemma).to(input.dtype))


def fused_add_rmsnorm(input, residual, weight, eps=1e-6, enable_pdl=None):
    _fused_add(input, residual, weight, eps, gemma=False)


def gemma_fused_add_rmsnorm(input, residual, weight, eps=1e-6, enable_pdl=None):
    _fused_add(input, residual, weight, eps, gemma=True)


def _gated(act, input, out):
    d = input.shape[-1] // 2
    return _into(act(input[..., :d]) * input[..., d:], out)


def silu_and_mul(input, out=None):
    return _gated(F.silu, input, out)


def gelu_and_mul(input, out=None):
    return _gated(lambda t: F.gelu(t, approximate="none"), input, out)


def gelu_tanh_and_mul(input, out=None):
    return _gated(lambda t: F.gelu(t, approximate="tanh"), input, out)


def _unavailable(qualname):
    def call(*args, **kwargs):
        raise NotImplementedError(f"{qualname} is not in the pure-torch sgl_kernel stand-in "
                                  "(carry sglkernel-site.tar.xz for the real sglang-kernel)")
    call.__name__ = call.__qualname__ = qualname.rsplit(".", 1)[-1]
    return call


for _name in ("int8_scaled_mm", "moe_sum", "moe_sum_reduce", "top_k_renorm_prob", "top_p_renorm_prob"):
    globals()[_name] = _unavailable(f"sgl_kernel.{_name}")
EOF
  cat >"$pkg/kvcacheio.py" <<'EOF'
"""Names SGLang imports from sgl_kernel.kvcacheio (LLM KV-cache transfer); the stand-in cannot run them."""
from sgl_kernel import _unavailable

for _name in ("transfer_kv_all_layer", "transfer_kv_all_layer_direct_lf_pf", "transfer_kv_all_layer_lf_pf",
              "transfer_kv_all_layer_lf_ph", "transfer_kv_all_layer_mla", "transfer_kv_all_layer_mla_lf_pf",
              "transfer_kv_direct", "transfer_kv_per_layer", "transfer_kv_per_layer_direct_pf_lf",
              "transfer_kv_per_layer_mla", "transfer_kv_per_layer_mla_pf_lf", "transfer_kv_per_layer_pf_lf",
              "transfer_kv_per_layer_ph_lf"):
    globals()[_name] = _unavailable(f"{__name__}.{_name}")
EOF
  cat >"$pkg/quantization.py" <<'EOF'
"""Names SGLang imports from sgl_kernel.quantization (GGUF kernels); the stand-in cannot run them."""
from sgl_kernel import _unavailable

for _name in ("ggml_dequantize", "ggml_moe_a8", "ggml_mul_mat_a8", "ggml_mul_mat_vec_a8"):
    globals()[_name] = _unavailable(f"{__name__}.{_name}")
EOF
  cat >"$pkg/allreduce.py" <<'EOF'
"""Imported by SGLang's custom all-reduce (tensor parallelism); the stand-in has no such kernels."""
EOF
  cat >"$pkg/flash_attn.py" <<'EOF'
"""No FA3 here, as in the real sgl_kernel without flash_ops: SGLang then needs --attention-backend torch_sdpa."""
raise ImportError("Can not import FA3 in sgl_kernel (pure-torch stand-in: no FlashAttention 3)")
EOF
}

prune_sglkernel() {
  local dir="$1"
  # Only the ops the Hopper path loads (sm90/common_ops, spatial_ops): no FA3 (flash_ops, 1 GB), FlashMLA,
  # InfLLM, sm100 ops, mscclpp, or the CUDA headers/libs and triton_kernels of the wheel.
  rm -rf "$dir/sgl_kernel/flash_ops.abi3.so" "$dir/sgl_kernel/flashmla_ops.abi3.so" "$dir/sgl_kernel/sm100" \
         "$dir"/sgl_kernel/infllm_ops*.so "$dir"/_mscclpp*.so "$dir/include" "$dir/lib" "$dir/lib64" \
         "$dir/triton_kernels"
  # sm90/common_ops links libnuma.so.1, which the device image may lack; device_env.sh puts this copy
  # on the server's LD_LIBRARY_PATH only when the system has none.
  local numa
  # awk reads to the end: an early exit would SIGPIPE ldconfig, which pipefail turns into a failure
  numa=$(ldconfig -p 2>/dev/null | awk '/libnuma\.so\.1 .*x86-64/ && !found {found = $NF} END {print found}')
  [ -n "$numa" ] || die "libnuma.so.1 not found here (apt-get install libnuma1)"
  mkdir -p "$dir/.libs"
  cp -L --remove-destination "$numa" "$dir/.libs/libnuma.so.1"
  common_prune "$dir"
}

# ------------------------------------------------------------------------------------------ build
pack() {  # pack NAME DIR: reproducible tar.xz of DIR's contents into $OUT_DIR/NAME-site.tar.xz
  local name="$1" dir="$2" out="$OUT_DIR/$1-site.tar.xz"
  say "compressing $name-site ($(du -sh "$dir" | cut -f1) unpacked) ..."
  rm -f "$out.tmp"
  tar -C "$dir" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -cf - . \
    | xz -T0 "$XZ_LEVEL" >"$out.tmp"
  mv "$out.tmp" "$out"
}

build() {  # build NAME: stage, prune, pack
  local name="$1" stage="$WORK/$1"
  rm -rf "$stage"; mkdir -p "$stage"
  case "$name" in
    main)
      fetch "$stage" "${MAIN_PKGS[@]}"
      prune_main "$stage" ;;
    sft)
      fetch "$stage" "${SFT_PKGS[@]}"
      prune_sft "$stage" ;;
    sglang)
      local pins=() n
      for n in "${SGLANG_NAMES[@]}"; do pins+=("$(pin_from_sglang_txt "$n")"); done
      fetch "$stage" "${pins[@]}"
      prune_sglang "$stage"
      rm -rf "$WORK/kernel-wheel"
      fetch "$WORK/kernel-wheel" "$SGL_KERNEL_PKG"
      write_sgl_kernel_shim "$stage" "$WORK/kernel-wheel" ;;
    sglkernel)
      fetch "$stage" "$SGL_KERNEL_PKG"
      prune_sglkernel "$stage" ;;
  esac
  # Nothing the device already has may shadow its own copy.
  local clash
  clash=$(cd "$stage" && ls -d torch triton nvidia cuda numpy transformers 2>/dev/null || true)
  [ -z "$clash" ] || die "$name-site would shadow the device's own: $clash"
  pack "$name" "$stage"
}

# ------------------------------------------------------------------------------------------ main
mib() { awk -v b="$1" 'BEGIN{printf "%.1f MiB", b/1048576}'; }
size_of() { local t=0 p; for p in "$@"; do [ -f "$OUT_DIR/$p-site.tar.xz" ] && t=$((t + $(stat -c %s "$OUT_DIR/$p-site.tar.xz"))); done; echo "$t"; }

main() {
  while [ $# -gt 0 ]; do
    case "$1" in
      --only) ONLY="${2:?--only needs a comma-separated list of main,sft,sglang,sglkernel}"; shift 2 ;;
      --out) OUT_DIR="$(realpath -m "${2:?--out needs a folder}")"; shift 2 ;;
      -h|--help) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
      *) die "unknown argument '$1' (try --help)" ;;
    esac
  done
  for part in ${ONLY//,/ }; do
    case "$part" in main|sft|sglang|sglkernel) ;; *) die "--only: unknown archive '$part' (main, sft, sglang, sglkernel)" ;; esac
  done
  for tool in uv strip xz tar; do command -v "$tool" >/dev/null || die "'$tool' not found"; done
  export UV_PYTHON_DOWNLOADS=never UV_NO_PROGRESS=1

  mkdir -p "$OUT_DIR" "$WORK"
  T0=$(date +%s)
  for part in ${ONLY//,/ }; do
    say "building $part-site"
    build "$part"
  done

  say "done in $(( $(date +%s) - T0 )) s; archives in $OUT_DIR:"
  for part in main sft sglang sglkernel; do
    f="$OUT_DIR/$part-site.tar.xz"
    [ -f "$f" ] && say "  $(basename "$f"): $(mib "$(stat -c %s "$f")")"
  done
  say "  per device call (64 MiB with the ~1 MiB repo): SFT main+sft $(mib "$(size_of main sft)"), serving" \
      "main+sglang(+sglkernel) $(mib "$(size_of main sglang)") ($(mib "$(size_of main sglang sglkernel)"))"
  [ -f "$OUT_DIR/libero-site.tar.xz" ] && say "  with LIBERO (pack_libero.sh): main+sglang+libero" \
      "$(mib "$(size_of main sglang libero)"), main+sglang+sglkernel+libero $(mib "$(size_of main sglang sglkernel libero)")"
  return 0
}

# Sourcing defines the functions only (tests call strip_elf and friends on their own files).
[ "${BASH_SOURCE[0]}" != "$0" ] || main "$@"
