"""benchmarks/gpu/pack_device_env.sh never modifies an installed environment.

Why this matters: uv hard-links the files of its shared cache into every environment it builds and, by
default, into ``uv pip install --target`` folders too, so a staged ``ray/_raylet.so`` can be the very inode
that ``.venv`` (and every other venv on the machine) runs. ``strip`` rewrites a file in place, through all
of its links: packing once stripped ``.venv``'s Ray under a running quickstart, which died with SIGSEGV.

The environment whose files must stay untouched is ``.venv`` unless ``RLINF_PACK_TEST_VENV`` names
another one (e.g. a scratch venv installed from its own ``UV_CACHE_DIR``, to watch an unsafe packer fail
without damaging ``.venv``). ``DEVPKG_XZ_LEVEL`` (default ``-0`` here) sets the archives' xz preset.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu" / "pack_device_env.sh"
VENV = Path(os.environ.get("RLINF_PACK_TEST_VENV", ROOT / ".venv"))
XZ_LEVEL = os.environ.get("DEVPKG_XZ_LEVEL", "-0")
# Top-level names the script refuses to stage (its clash check): never drawn from, so not hashed.
NEVER_STAGED = {"torch", "triton", "nvidia", "cuda", "numpy", "transformers"}
# Files the script strips (prune_main, prune_sft): the ones a write-through would damage.
RAY_STRIPPED = ("ray/_raylet.so", "ray/core/src/ray/raylet/raylet", "ray/core/src/ray/gcs/gcs_server")


def _site_packages(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python3*/site-packages"))
    if len(found) != 1:
        pytest.fail(f"no single lib/python3*/site-packages under {venv} (found {found}); install the "
                    "environment (bash requirements/install.sh) or point RLINF_PACK_TEST_VENV at one")
    return found[0].resolve()


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _hash_tree(site: Path) -> dict[str, str]:
    """sha256 of every regular file of ``site`` (relative path -> digest), outside NEVER_STAGED."""
    digests = {}
    for top in site.iterdir():
        if top.name in NEVER_STAGED:
            continue
        paths = [top] if top.is_file() else (p for p in top.rglob("*") if p.is_file())
        for path in paths:
            if not path.is_symlink():
                digests[path.relative_to(site).as_posix()] = _sha256(path)
    return digests


def _tool(name: str) -> str | None:
    """``name`` on PATH, or uv where its installer puts it (~/.local/bin, ~/.cargo/bin)."""
    found = shutil.which(name)
    if found is None and name == "uv":
        for cand in (Path.home() / ".local/bin/uv", Path.home() / ".cargo/bin/uv"):
            if os.access(cand, os.X_OK):
                return str(cand)
    return found


def _archive_files(archive: Path) -> set[str]:
    with tarfile.open(archive, "r:xz") as tar:
        return {m.name.removeprefix("./") for m in tar.getmembers() if m.isfile()}


def _staged_files(stage: Path) -> set[str]:
    return {p.relative_to(stage).as_posix() for p in stage.rglob("*") if p.is_file() and not p.is_symlink()}


def _av_extension(site: Path) -> Path:
    found = sorted((site / "av").glob("*.so"))
    if not found:
        pytest.fail(f"{site} has no PyAV extension modules (av/*.so); install av==15.1.0 there")
    return found[0]


def test_strip_elf_never_writes_through_a_hard_link(tmp_path: Path) -> None:
    """strip_elf on a staged file hard-linked to an installed one leaves the installed one as it was."""
    if _tool("strip") is None:
        pytest.skip("strip (binutils) not found")
    installed = tmp_path / "installed" / "mod.so"
    staged = tmp_path / "stage" / "mod.so"
    installed.parent.mkdir()
    staged.parent.mkdir()
    shutil.copyfile(_av_extension(_site_packages(VENV)), installed)  # an unstripped cython module
    os.link(installed, staged)
    before = _sha256(installed)

    subprocess.run(["bash", "-c", 'source "$1" && strip_elf "$2"', "_", str(SCRIPT), str(staged)],
                   check=True, capture_output=True, text=True)

    assert _sha256(installed) == before, "strip_elf wrote through the hard link into the installed file"
    assert os.stat(installed).st_nlink == 1, "the staged name still links the installed file"
    assert staged.stat().st_ino != installed.stat().st_ino
    assert staged.stat().st_size < installed.stat().st_size, "strip_elf did not strip the staged copy"
    assert not list(staged.parent.glob("*.tmp")), "strip_elf left its private copy behind"


@pytest.mark.slow
def test_packing_main_and_sft_leaves_the_installed_environment_untouched(tmp_path: Path) -> None:
    """A real ``--only main,sft`` pack: every .venv file the archives draw from is byte-identical afterwards,
    and no staged file (the stripped ray/av binaries included) shares an inode with .venv's copy."""
    tools = {name: _tool(name) for name in ("uv", "strip", "xz", "tar")}
    missing = [name for name, path in tools.items() if path is None]
    if missing:
        pytest.skip(f"packing needs {', '.join(missing)} (not found on PATH)")
    site = _site_packages(VENV)
    before = _hash_tree(site)
    inode_before = {rel: os.stat(site / rel).st_ino for rel in before}

    out, work = tmp_path / "devpkg", tmp_path / "work"
    env = dict(os.environ, DEVPKG_WORK=str(work), DEVPKG_XZ_LEVEL=XZ_LEVEL,
               PATH=os.pathsep.join([str(Path(tools["uv"]).parent), os.environ.get("PATH", "")]))
    run = subprocess.run(["bash", str(SCRIPT), "--only", "main,sft", "--out", str(out)], env=env,
                         capture_output=True, text=True, timeout=3600)
    assert run.returncode == 0, f"packing failed:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"

    drawn: dict[str, Path] = {}  # relative path (in .venv and in an archive) -> its staged file
    for name in ("main", "sft"):
        stage, archive = work / name, out / f"{name}-site.tar.xz"
        assert archive.is_file(), f"--out was not honoured: no {archive}"
        members = _archive_files(archive)
        assert members == _staged_files(stage), f"{name}-site does not hold exactly its staged tree"
        assert not {m.split("/", 1)[0] for m in members} & NEVER_STAGED
        drawn.update({rel: stage / rel for rel in members if rel in before})
    av_modules = [rel for rel in drawn if rel.startswith("av/") and rel.endswith(".so")]
    needed = [rel for rel in RAY_STRIPPED if rel not in drawn] + ([] if av_modules else ["av/*.so"])
    assert not needed, (f"{site} lacks {needed}: it must hold ray 2.60.0 and av 15.1.0 "
                        "(requirements/main.txt) for this test to watch the stripped files")

    changed = sorted(rel for rel in drawn if _sha256(site / rel) != before[rel])
    assert not changed, f"packing modified {len(changed)} installed files, e.g. {changed[:5]}"
    replaced = sorted(rel for rel in drawn if os.stat(site / rel).st_ino != inode_before[rel])
    assert not replaced, f"packing replaced {len(replaced)} installed files, e.g. {replaced[:5]}"
    shared = sorted(rel for rel, staged in drawn.items() if os.stat(staged).st_ino == inode_before[rel])
    assert not shared, f"{len(shared)} staged files share an inode with {site}, e.g. {shared[:5]}"
    # The strip really ran (on the private copies): the staged binaries differ from the installed ones.
    for rel in (*RAY_STRIPPED, av_modules[0]):
        assert _sha256(drawn[rel]) != before[rel], f"{rel} was not stripped in the stage"
