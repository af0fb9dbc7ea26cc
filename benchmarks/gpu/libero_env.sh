# Source this (bash) on the device to run the packed LIBERO simulator (benchmarks/gpu/pack_libero.sh):
#
#   source benchmarks/gpu/libero_env.sh [ARCHIVE]     # default: <repo>/.devpkg/libero-site.tar.xz
#
# 1. unpacks ARCHIVE into $LIBERO_SITE (default /tmp/site-libero; skipped when that archive is already
#    unpacked there, or when no archive was carried and an earlier unpack is there) and
#    turns the WebP-stored textures back into the PNGs MuJoCo reads (pillow of the base interpreter),
#    then byte-compiles it (~3 s here);
# 2. writes LIBERO's config ($LIBERO_ENV_DIR/libero_config/config.yaml, default dir /tmp/libero-env)
#    pointing at the unpacked package;
# 3. writes the interpreter wrapper $LIBERO_ENV_DIR/bin/python, which exec's the base interpreter
#    ($LIBERO_BASE_PYTHON, else $RLINF_DEVICE_PYTHON, else python3: the device's 3.12 with numpy 2,
#    torch, scipy...) with PYTHONPATH=$LIBERO_SITE:<repo root>; MUJOCO_GL=egl, PYOPENGL_PLATFORM=egl,
#    LIBERO_CONFIG_PATH and MUJOCO_EGL_DEVICE_ID=0 unless already set; only where the machine has no
#    libEGL.so.1, the packed glvnd loaders on LD_LIBRARY_PATH; and NVIDIA's EGL vendor file
#    (__EGL_VENDOR_LIBRARY_FILENAMES) where glvnd's own folders name no NVIDIA vendor;
# 4. exports RLINF_COSMOS3_LIBERO_PYTHON (the wrapper), LIBERO_CONFIG_PATH, MUJOCO_GL=egl,
#    PYOPENGL_PLATFORM=egl, so LiberoSimProcess starts simulators from it.
# Returns non-zero (never exits the shell) on failure.

_libero_env_setup() {
  local repo archive base site envdir cfg wrapper gl_path="" vendor=""
  repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
  archive="${1:-${LIBERO_SITE_ARCHIVE:-$repo/.devpkg/libero-site.tar.xz}}"
  site="${LIBERO_SITE:-/tmp/site-libero}"
  envdir="${LIBERO_ENV_DIR:-/tmp/libero-env}"
  # `command -v`, not a resolved path: the device's python3 is a venv's (/opt/torch/.venv/bin/python3)
  base="$(command -v "${LIBERO_BASE_PYTHON:-${RLINF_DEVICE_PYTHON:-python3}}")" || {
    echo "[libero_env] base interpreter ${LIBERO_BASE_PYTHON:-${RLINF_DEVICE_PYTHON:-python3}} not found" >&2; return 1; }

  # Unpack unless this very archive is unpacked there already (or, with no archive carried, an
  # earlier unpack is there: a machine still warm from the last call).
  local stamp=""
  [ -f "$archive" ] && stamp="$(sha256sum "$archive" | cut -c1-16)"
  if [ -z "$stamp" ] && [ ! -f "$site/.unpacked" ]; then
    echo "[libero_env] archive $archive not found (build it with benchmarks/gpu/pack_libero.sh)" >&2; return 1
  fi
  if [ -n "$stamp" ] && [ "$(cat "$site/.unpacked" 2>/dev/null)" != "$stamp" ]; then
    rm -rf "$site" && mkdir -p "$site" || return 1
    tar -xJf "$archive" -C "$site" || { echo "[libero_env] unpacking $archive failed" >&2; return 1; }
    "$base" - "$site" <<'PY' || { echo "[libero_env] restoring the PNG textures failed" >&2; return 1; }
import os
import sys

from PIL import Image

site = sys.argv[1]
with open(os.path.join(site, "_libero_pack", "webp.txt")) as f:
    for rel in filter(None, (line.strip() for line in f)):
        png = os.path.join(site, rel)
        with Image.open(png + ".webp") as img:
            img.save(png, "PNG", compress_level=1)
        os.remove(png + ".webp")
PY
    # byte-compile once, so that many simulator processes starting together don't each compile
    "$base" -m compileall -q -j 0 "$site" >/dev/null 2>&1 || true
    echo "$stamp" >"$site/.unpacked"
  fi

  cfg="$envdir/libero_config"  # where rlinf_cosmos3.paths.libero_config_dir() looks for this interpreter
  mkdir -p "$envdir/bin" "$cfg" || return 1
  local pkg="$site/libero/libero"
  printf 'assets: %s\nbddl_files: %s\nbenchmark_root: %s\ndatasets: %s\ninit_states: %s\n' \
    "$pkg/assets" "$pkg/bddl_files" "$pkg" "$site/libero/datasets" "$pkg/init_files" >"$cfg/config.yaml"

  # EGL: the system's glvnd loaders if there are any, else the packed ones. glvnd then needs a vendor
  # file naming the driver's libEGL_nvidia.so.0; the device mounts NVIDIA's under /usr/local/nvidia.
  if ! ldconfig -p 2>/dev/null | grep -q 'libEGL\.so\.1 '; then
    [ -d "$site/_gl" ] && gl_path="$site/_gl"
  fi
  if [ -z "${__EGL_VENDOR_LIBRARY_FILENAMES:-}" ] \
     && ! grep -qsl nvidia /usr/share/glvnd/egl_vendor.d/*.json /etc/glvnd/egl_vendor.d/*.json; then
    for f in /usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json /usr/share/glvnd/egl_vendor.d/10_nvidia.json; do
      [ -f "$f" ] && { vendor="$f"; break; }
    done
  fi
  if [ -n "$vendor" ] && ! ldconfig -p 2>/dev/null | grep -q libEGL_nvidia && [ -d /usr/local/nvidia/lib64 ]; then
    gl_path="${gl_path:+$gl_path:}/usr/local/nvidia/lib64"
  fi

  wrapper="$envdir/bin/python"
  {
    echo '#!/bin/sh'
    echo "# written by $repo/benchmarks/gpu/libero_env.sh"
    echo "export PYTHONPATH=\"$site:$repo\${PYTHONPATH:+:\$PYTHONPATH}\""
    # mujoco picks its GL backend at import (glfw, not carried, unless told): default to EGL
    echo "export MUJOCO_GL=\"\${MUJOCO_GL:-egl}\" PYOPENGL_PLATFORM=\"\${PYOPENGL_PLATFORM:-egl}\""
    echo "export LIBERO_CONFIG_PATH=\"\${LIBERO_CONFIG_PATH:-$cfg}\""
    # robosuite renders on EGL device MUJOCO_EGL_DEVICE_ID, else it reads CUDA_VISIBLE_DEVICES as an
    # EGL device index (and fails on an empty one, as a GPU-less Ray worker may have): pin it
    echo "export MUJOCO_EGL_DEVICE_ID=\"\${MUJOCO_EGL_DEVICE_ID:-0}\""
    [ -n "$gl_path" ] && echo "export LD_LIBRARY_PATH=\"$gl_path\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}\""
    [ -n "$vendor" ] && echo "export __EGL_VENDOR_LIBRARY_FILENAMES=\"$vendor\""
    echo "exec \"$base\" \"\$@\""
  } >"$wrapper" && chmod +x "$wrapper" || return 1

  export RLINF_COSMOS3_LIBERO_PYTHON="$wrapper"
  export LIBERO_CONFIG_PATH="$cfg"
  export MUJOCO_GL=egl
  export PYOPENGL_PLATFORM=egl
  echo "[libero_env] LIBERO from $site via $wrapper (base $base${gl_path:+, LD_LIBRARY_PATH+=$gl_path}${vendor:+, EGL vendor $vendor})" >&2
}

_libero_env_setup "$@"
