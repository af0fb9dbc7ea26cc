#!/usr/bin/env bash
# Build .devpkg/libero-site.tar.xz: the LIBERO simulator (one suite's scenes) as a cp312 site folder
# for a machine without internet that has Python 3.12 with numpy 2, torch, scipy, opencv, pillow,
# matplotlib, numba, pyyaml, filelock... but no LIBERO. Unpack and use it with
# benchmarks/gpu/libero_env.sh.
#
#   bash benchmarks/gpu/pack_libero.sh [--suite libero_spatial] [--texture-max 1024] [--no-gl]
#                                      [--relist] [--out .devpkg/libero-site.tar.xz]
#
# What goes in (nothing else):
#   code   rlinf-libero (package `libero`, only the suite's BDDL and init-state files), robosuite
#          (code + only the scene files the suite reads), bddl (.py only), mujoco 3.3.7 cp312
#          manylinux wheel, PyOpenGL, gym + gym_notices (.py only), easydict, termcolor,
#          future.utils: the distributions a simulator process imports that the device lacks
#          (found from sys.modules after make/reset/steps), less their unused parts (below).
#          numpy is NOT carried: LIBERO runs on the device's numpy 2.x.
#   scene  the files toolkits/libero/list_scene_assets.py lists for the suite (MJCF file=
#          references plus every XML/JSON Python opened while building the scenes).
#          PNG textures larger than --texture-max pixels on a side (default 1024; 0 = keep) are
#          box-downscaled by a power of 2 (the renders are 256x256: MuJoCo samples those mip levels
#          anyway); RGB/RGBA PNGs are stored as lossless WebP (exact=True; pixels checked equal on
#          the way in) and turned back into PNGs by libero_env.sh at unpack time.
#   _gl/   glvnd's EGL/OpenGL loader libraries (libEGL.so.1, libOpenGL.so.0, libGL.so.1, libGLX.so.0,
#          libGLdispatch.so.0, ~0.4 MiB packed) from this machine, used by libero_env.sh only if the
#          device has no libEGL.so.1 (--no-gl leaves them out).
#
# Needs: .venv-libero (for the asset list; its versions are the pins below), .venv (pillow), uv
# (with a warm cache or PyPI). The asset list is cached in .devpkg/libero-assets-<suite>.json
# (--relist rebuilds it, ~80 s).
#
# Packing never writes to a file it did not create: .venv-libero's scene files and the fetched wheels
# are only read; every packed file is a new copy in a private temp folder, and textures are re-encoded
# from those reads into new files there.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SUITE=libero_spatial
TEXTURE_MAX=1024
WITH_GL=1
RELIST=0
OUT="$ROOT/.devpkg/libero-site.tar.xz"
# The simulator environment's versions (requirements/libero.txt resolves to these in .venv-libero).
PINS=(mujoco==3.3.7 robosuite==1.4.1 rlinf-libero==0.1.3 bddl==3.6.0 pyopengl==3.1.10 gym==0.26.2
      gym-notices==0.1.0 easydict==1.14 termcolor==3.3.0 future==1.0.0)
GL_LIBS=(libEGL.so.1 libGLdispatch.so.0 libOpenGL.so.0 libGL.so.1 libGLX.so.0)

die() { echo "[pack_libero] ERROR: $*" >&2; exit 1; }
# shellcheck source=../../requirements/find_uv.sh
source "$ROOT/requirements/find_uv.sh"  # uv where requirements/install.sh put it (~/.local/bin), off PATH
uv_onto_path || die "uv not found (requirements/install.sh installs it; or: pip install uv)"
say() { echo "[pack_libero] $*" >&2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --suite) SUITE="${2:?}"; shift 2 ;;
    --texture-max) TEXTURE_MAX="${2:?}"; shift 2 ;;
    --no-gl) WITH_GL=0; shift ;;
    --relist) RELIST=1; shift ;;
    --out) OUT="$(realpath -m "${2:?}")"; shift 2 ;;
    -h|--help) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1'" ;;
  esac
done

LIBERO_PY="$ROOT/.venv-libero/bin/python"
MAIN_PY="$ROOT/.venv/bin/python"
[ -x "$LIBERO_PY" ] || die "$LIBERO_PY missing (bash requirements/install.sh)"
[ -x "$MAIN_PY" ] || die "$MAIN_PY missing (bash requirements/install.sh)"
export UV_PYTHON_DOWNLOADS=never UV_NO_PROGRESS=1

# Pins must be what .venv-libero runs (the asset list and the reference states come from it).
for pin in "${PINS[@]}"; do
  name="${pin%%==*}" want="${pin#*==}"
  have=$(VIRTUAL_ENV="$ROOT/.venv-libero" uv pip show "$name" 2>/dev/null | sed -n 's/^Version: //p')
  [ "$have" = "$want" ] || say "warning: .venv-libero has $name ${have:-<none>}, packing $want"
done

mkdir -p "$ROOT/.devpkg"
LIST="$ROOT/.devpkg/libero-assets-$SUITE.json"
if [ "$RELIST" = 1 ] || [ ! -s "$LIST" ]; then
  say "listing the scene files of $SUITE with .venv-libero (every task built, reset and stepped)"
  if ! LIBERO_CONFIG_PATH="$ROOT/.venv-libero/libero_config" MUJOCO_GL=egl PYOPENGL_PLATFORM=egl \
      "$LIBERO_PY" "$ROOT/toolkits/libero/list_scene_assets.py" --suite "$SUITE" --out "$LIST.tmp" \
      2>"$LIST.log"; then
    tail -30 "$LIST.log" >&2; die "listing the scene files failed (log: $LIST.log)"
  fi
  grep -E '^\[list_scene_assets\]' "$LIST.log" | tail -1 >&2
  mv "$LIST.tmp" "$LIST"
fi

WORK=$(mktemp -d /tmp/pack-libero.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
DL="$WORK/dl" SITE="$WORK/site"
mkdir -p "$SITE"
say "fetching cp312 builds: ${PINS[*]}"
# --link-mode copy: uv's default hard-links its shared cache into --target, the same inodes every venv
# built from that cache runs; nothing below writes into $DL, but then nothing could reach them if it did.
uv pip install -q --target "$DL" --link-mode copy --python-version 3.12 --python-platform x86_64-manylinux_2_28 \
  --no-deps "${PINS[@]}"

# Code. cp (new files in $SITE, never links), so the texture rewriting below only ever touches copies.
copy_tree() {  # copy_tree <pkg dir under $DL> [find filters...]: files of a package into $SITE
  local pkg="$1"; shift
  (cd "$DL" && find "$pkg" -type f ! -path '*/__pycache__/*' ! -name '*.pyc' "$@" -print0) \
    | (cd "$DL" && xargs -0 cp --parents -t "$SITE")
}
# Left out: what no simulator process imports (checked with sys.modules after make/reset/steps on
# every task): mujoco's viewer, rollout, USD export, headers and tests; PyOpenGL's Windows DLLs and
# its WGL/AGL/GLES/GLUT/GLE/Tk bindings; all of `future` but future.utils (bddl's one import).
copy_tree mujoco ! -path 'mujoco/include/*' ! -path 'mujoco/testdata/*' ! -path 'mujoco/usd/*' ! -name '*_test.py' \
  ! -name '_simulate.*' ! -name 'viewer.py' ! -name '_rollout.*' ! -name 'rollout.py'
copy_tree robosuite ! -path 'robosuite/models/assets/*' ! -path 'robosuite/demos/*'
copy_tree libero ! -path 'libero/libero/bddl_files/*' ! -path 'libero/libero/init_files/*' ! -path 'libero/libero/assets/*'
copy_tree bddl -name '*.py'
copy_tree gym -name '*.py'
gl_skip=()
for api in DLLS Tk AGL WGL GLES1 GLES2 GLES3 GLUT GLE; do gl_skip+=(! -path "OpenGL/$api/*" ! -path "OpenGL/raw/$api/*"); done
copy_tree OpenGL "${gl_skip[@]}"
copy_tree future \( -path 'future/__init__.py' -o -path 'future/utils/*' \)
for pkg in gym_notices easydict termcolor; do copy_tree "$pkg"; done
[ -d "$DL/mujoco.libs" ] && cp -r "$DL/mujoco.libs" "$SITE/"

if [ "$WITH_GL" = 1 ]; then
  mkdir -p "$SITE/_gl"
  for lib in "${GL_LIBS[@]}"; do
    src=$(ldconfig -p | awk -v l="$lib" '$1 == l && /x86-64/ {print $NF; exit}')
    [ -n "$src" ] || die "$lib not found on this machine (apt-get install libegl1 libopengl0 libgl1 libglx0 libglvnd0, or --no-gl)"
    cp -L "$src" "$SITE/_gl/$lib"
  done
  # PyOpenGL dlopens libEGL.so / libOpenGL.so / libGL.so before the versioned names
  for lib in libEGL.so.1 libOpenGL.so.0 libGL.so.1; do ln -s "$lib" "$SITE/_gl/${lib%.so.*}.so"; done
fi

say "staging scene files (texture max ${TEXTURE_MAX}px)"
"$MAIN_PY" - "$LIST" "$SITE" "$TEXTURE_MAX" "$SUITE" "${PINS[*]}" <<'PY'
"""Copy the listed scene files into the site tree; downscale and WebP-encode PNG textures."""
import io
import json
import os
import shutil
import sys
import time

import numpy as np
from PIL import Image

list_path, site, texture_max, suite, pins = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
listing = json.load(open(list_path))
dest_of = {
    "robosuite": os.path.join(site, "robosuite"),
    "libero": os.path.join(site, "libero", "libero"),
    "libero_assets": os.path.join(site, "libero", "libero", "assets"),
    "bddl": os.path.join(site, "bddl"),
}
webp, resized, skipped = [], [], []
raw_bytes = 0
for entry in listing["files"]:
    if entry["root"] not in dest_of:
        skipped.append(entry["path"])  # dist-info entry points, the local LIBERO config, matplotlibrc
        continue
    dest = os.path.join(dest_of[entry["root"]], entry["relpath"])
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    raw_bytes += entry["bytes"]
    if not dest.endswith(".png"):
        shutil.copyfile(entry["path"], dest)
        continue
    img = Image.open(entry["path"])
    img.load()
    changed = False
    if texture_max > 0 and max(img.size) > texture_max:
        if img.mode not in ("RGB", "RGBA"):
            img = img.convert("RGBA" if "A" in img.mode or "transparency" in img.info else "RGB")
        factor = 1
        while max(img.size) / factor > texture_max:
            factor *= 2
        resized.append(f"{entry['relpath']}: {img.size} -> /{factor}")
        img = img.reduce(factor)  # box filter, like a mip level
        changed = True
    if img.mode in ("RGB", "RGBA"):
        buf = io.BytesIO()
        img.save(buf, "WEBP", lossless=True, quality=100, method=6, exact=True)
        back = Image.open(io.BytesIO(buf.getvalue()))
        back.load()
        png_size = entry["bytes"] if not changed else None
        if png_size is None:
            tmp = io.BytesIO()
            img.save(tmp, "PNG", optimize=True)
            png_size = tmp.tell()
        if back.mode == img.mode and np.array_equal(np.asarray(back), np.asarray(img)) and buf.tell() < png_size:
            with open(dest + ".webp", "wb") as f:
                f.write(buf.getvalue())
            webp.append(os.path.relpath(dest, site))
            continue
    if changed:
        img.save(dest, "PNG", optimize=True)
    else:
        shutil.copyfile(entry["path"], dest)

meta = os.path.join(site, "_libero_pack")
os.makedirs(meta, exist_ok=True)
with open(os.path.join(meta, "webp.txt"), "w") as f:
    f.write("".join(p + "\n" for p in webp))
with open(os.path.join(meta, "manifest.json"), "w") as f:
    json.dump({"suite": suite, "task_ids": listing["task_ids"], "pins": pins.split(), "texture_max": texture_max,
               "scene_files": len(listing["files"]) - len(skipped), "scene_bytes_raw": raw_bytes,
               "webp_textures": webp, "resized_textures": resized, "built": time.strftime("%Y-%m-%d %H:%M:%S")},
              f, indent=1)
print(f"[pack_libero] {len(listing['files']) - len(skipped)} scene files ({raw_bytes / 2**20:.1f} MiB raw), "
      f"{len(resized)} textures downscaled, {len(webp)} stored as WebP; not packed: {len(skipped)} files "
      "outside the package roots", file=sys.stderr)
PY

say "compressing (xz -9e)"
mkdir -p "$(dirname "$OUT")"
tar -C "$SITE" --sort=name --owner=0 --group=0 --numeric-owner --mtime='@0' -cf - . | xz -9e -T1 >"$OUT.tmp"
mv "$OUT.tmp" "$OUT"
say "$(du -sh "$SITE" | cut -f1) unpacked; by top folder (uncompressed):"
(cd "$SITE" && du -s --block-size=1K -- * | sort -rn | awk '{printf "  %6.1f MiB  %s\n", $1/1024, $2}' >&2)
say "wrote $OUT: $(stat -c %s "$OUT" | awk '{printf "%.2f MiB", $1/1048576}')"
