"""The packing scripts find uv where requirements/install.sh puts it, with that folder off PATH (issue #33).

install.sh bootstraps uv with ``pip install --user`` (the user base's ``bin/``: ``~/.local/bin``, or
``$PYTHONUSERBASE/bin``), which a README-built machine need not have on PATH. Each case runs the real script
in a clean environment whose PATH holds only the system folders and python3, with a stand-in ``uv`` placed
where pip would put it; the scripts' ``--help`` runs after their uv check.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = ("benchmarks/gpu/pack_device_env.sh", "benchmarks/gpu/pack_libero.sh")


def _fake_uv(folder: Path) -> Path:
    folder.mkdir(parents=True)
    uv = folder / "uv"
    uv.write_text("#!/bin/sh\necho 'uv 0.0.0'\n")
    uv.chmod(0o755)
    return uv


def _run(cmd: list[str], home: Path, **env: str) -> subprocess.CompletedProcess[str]:
    python_dir = Path(sys.executable).parent  # a python3 to ask for its user base, as on a set-up machine
    path = os.pathsep.join([str(python_dir), "/usr/bin", "/bin"])
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={"HOME": str(home), "PATH": path, **env})


@pytest.mark.parametrize("script", SCRIPTS)
def test_uv_in_the_user_bin_off_path_is_found(script: str, tmp_path: Path) -> None:
    _fake_uv(tmp_path / ".local" / "bin")
    proc = _run(["bash", script, "--help"], tmp_path)
    assert proc.returncode == 0 and "uv not found" not in proc.stderr, proc.stderr


def test_uv_under_pythonuserbase_is_found(tmp_path: Path) -> None:
    uv = _fake_uv(tmp_path / "base" / "bin")
    proc = _run(["bash", "-c", "source requirements/find_uv.sh && uv_onto_path && command -v uv"], tmp_path / "home",
                PYTHONUSERBASE=str(tmp_path / "base"))
    assert proc.returncode == 0 and proc.stdout.strip() == str(uv), proc.stderr


@pytest.mark.parametrize("script", SCRIPTS)
def test_no_uv_anywhere_is_refused_with_the_fix(script: str, tmp_path: Path) -> None:
    if any((Path(p) / "uv").exists() for p in ("/usr/bin", "/bin", Path(sys.executable).parent)):
        pytest.skip("uv is installed system-wide here: the missing case cannot be made")
    proc = _run(["bash", script, "--help"], tmp_path)
    assert proc.returncode != 0 and "uv not found (requirements/install.sh installs it" in proc.stderr, proc.stderr
