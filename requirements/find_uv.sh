# Sourced by requirements/install.sh and the packing scripts (benchmarks/gpu/pack_*.sh): find uv where the
# installer puts it, so a machine set up by the README packs without the user editing PATH.
#
# install.sh bootstraps uv with `python3 -m pip install --user uv` (the user base's bin/: ~/.local/bin unless
# PYTHONUSERBASE says otherwise), or, where --user is refused, `pip install uv` (the interpreter's scripts
# folder). Neither is always on PATH (a non-login shell, pyenv's shims). uv_onto_path appends the first of
# these folders that holds uv to this shell's PATH; nothing on disk or in the user's shell files changes.

uv_onto_path() {  # uv_onto_path -> 0 with uv callable, 1 when it is nowhere the installer puts it
  command -v uv >/dev/null 2>&1 && return 0
  local dirs=("$HOME/.local/bin") py dir
  if py=$(command -v python3 2>/dev/null); then
    dir=$("$py" -c 'import site; print(site.getuserbase())' 2>/dev/null) && dirs+=("$dir/bin")
    dir=$("$py" -c 'import sysconfig; print(sysconfig.get_path("scripts"))' 2>/dev/null) && dirs+=("$dir")
  fi
  for dir in "${dirs[@]}"; do
    if [ -x "$dir/uv" ]; then
      export PATH="$PATH:$dir"
      return 0
    fi
  done
  return 1
}
