"""``benchmarks/gpu/detached.sh``: inputs carried to the device in parts, and a job that outlives the call
that started it. Run for real: bash, tar, split, setsid and signals."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu" / "detached.sh"


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "DETACHED_DIR": str(tmp_path / "jobs")})


def test_a_directory_packed_into_parts_unpacks_only_when_every_part_is_there(tmp_path) -> None:
    src = tmp_path / "demos"
    (src / "data").mkdir(parents=True)
    payload = os.urandom(3 * 1024 * 1024 + 123)
    (src / "data" / "file.bin").write_bytes(payload)
    (src / "info.json").write_text('{"episodes": 2}')
    missing = _run(tmp_path, "pack", str(tmp_path / "nothing"), str(tmp_path / "carry" / "demos"))
    assert missing.returncode == 2 and "no directory" in missing.stderr
    packed = _run(tmp_path, "pack", str(src), str(tmp_path / "carry" / "demos"), "1")
    assert packed.returncode == 0, packed.stderr
    parts = sorted((tmp_path / "carry").iterdir())
    assert [p.name for p in parts] == [f"demos.part{i:02d}" for i in range(4)]  # 3 MiB + tar headers, 1 MiB each
    assert all(p.stat().st_size <= 1024 * 1024 for p in parts)

    dest = tmp_path / "device"
    parts[-1].rename(tmp_path / "later")  # one call's part not carried yet
    waiting = _run(tmp_path, "unpack", str(dest), str(tmp_path / "carry" / "demos"), "4")
    assert waiting.returncode == 3 and "3 of 4 parts" in waiting.stdout
    assert not dest.exists()
    (tmp_path / "later").rename(parts[-1])
    done = _run(tmp_path, "unpack", str(dest), str(tmp_path / "carry" / "demos"), "4")
    assert done.returncode == 0, done.stderr
    assert (dest / "demos" / "data" / "file.bin").read_bytes() == payload
    assert (dest / "demos" / "info.json").read_text() == '{"episodes": 2}'
    assert sorted(p.name for p in dest.iterdir()) == [".unpacked-demos", "demos"]  # no staging folder left
    assert not list((tmp_path / "carry").iterdir())  # the parts are deleted once unpacked
    later = _run(tmp_path, "unpack", str(dest), str(tmp_path / "carry" / "demos"), "4")  # a later call
    assert later.returncode == 0 and "already unpacked" in later.stdout


def test_parts_can_be_sized_one_by_one_to_fill_what_each_call_has_left(tmp_path) -> None:
    src = tmp_path / "demos"
    src.mkdir()
    payload = os.urandom(5 * 1024 * 1024)
    (src / "file.bin").write_bytes(payload)
    bad = _run(tmp_path, "pack", str(src), str(tmp_path / "carry" / "demos"), "1,x")
    assert bad.returncode == 2 and "whole MiB" in bad.stderr
    packed = _run(tmp_path, "pack", str(src), str(tmp_path / "carry" / "demos"), "1,3,2")
    assert packed.returncode == 0, packed.stderr
    sizes = [p.stat().st_size for p in sorted((tmp_path / "carry").iterdir())]
    mib = 1024 * 1024
    assert sizes[:2] == [1 * mib, 3 * mib] and len(sizes) == 3 and 1 * mib < sizes[2] <= 2 * mib  # 5 MiB + headers
    done = _run(tmp_path, "unpack", str(tmp_path / "device"), str(tmp_path / "carry" / "demos"), "3")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "device" / "demos" / "file.bin").read_bytes() == payload


def test_a_detached_job_outlives_its_call_and_wait_reports_its_exit_code(tmp_path) -> None:
    job = ["bash", "-c", "echo begin; sleep 3; echo end; exit 7"]
    started = _run(tmp_path, "start", "job", "--", *job)
    assert started.returncode == 0 and "started job" in started.stdout, started.stderr
    again = _run(tmp_path, "start", "job", "--", *job)
    assert again.returncode == 3 and "already running" in again.stderr
    early = _run(tmp_path, "wait", "job", "0")
    assert early.returncode == 3 and "still running" in early.stdout
    done = _run(tmp_path, "wait", "job", "60", "5")
    assert done.returncode == 7 and "begin\nend" in done.stdout and "ended with exit code 7" in done.stdout
    assert (tmp_path / "jobs" / "job.rc").read_text().strip() == "7"


def test_a_killed_job_is_reported_as_gone(tmp_path) -> None:
    started = _run(tmp_path, "start", "killed", "--", "sleep", "300")
    assert started.returncode == 0, started.stderr
    pid = int((tmp_path / "jobs" / "killed.pid").read_text())
    time.sleep(0.5)
    os.killpg(pid, signal.SIGKILL)  # the job's own session: nothing of it is left
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    gone = _run(tmp_path, "wait", "killed", "5")
    assert gone.returncode == 1 and "gone without an exit code" in gone.stdout
