"""The library's layers point one way (docs/architecture.md, "Layers").

Every module under ``rlinf_cosmos3/`` is parsed with ``ast`` (nothing is imported, so the test is fast
and sees imports that never run here): each ``import`` of the package, at module level, inside a
function (lazy) or under ``TYPE_CHECKING``, is a dependency. A lazy import still ties the two modules
together; it only postpones the cost. The test fails when

* a module imports a higher layer (a worker from ``checkpoint/``, a runner from a worker, ...);
* packages import each other in a cycle (``a`` imports ``b`` and ``b`` imports ``a``, possibly via others);
* modules import each other in a cycle, also inside one package;
* a listed known exception no longer occurs (delete it from ``KNOWN_UPWARD``: the list only shrinks).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

PACKAGE = "rlinf_cosmos3"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE

# Layer of each top-level part of the package; a module may import its own layer and the ones below.
# Entry points (examples/, evaluations/, toolkits/, benchmarks/) sit above runners, outside the package.
LAYERS: dict[str, int] = {
    # 0: configuration schemas and stdlib-only helpers; everything may import them.
    "config": 0, "paths": 0, "procgroup": 0, "id_lists": 0, "lazy_exports": 0, "__init__": 0,
    # 1: the pieces: conventions, data, simulator bridge, model, training components, checkpoints,
    #    Ray plumbing, run tracking, scripted demonstrations, config checks against what is on disk. They may
    #    import each other without cycles.
    "actions": 1, "data": 1, "sim": 1, "models": 1, "components": 1, "checkpoint": 1,
    "cluster": 1, "tracking": 1, "demos": 1, "validation": 1,
    # the RL pieces (flow-SDE steps and log-probs, the action chain on the policy's forward, GRPO advantages,
    # the PPO losses, GAE, the value head): like models/
    "rl": 1,
    # 2: Ray workers (SFT actor, rollout backends, LIBERO env workers).
    "workers": 2,
    # 3: drivers that place workers and run a whole job.
    "runners": 3,
}
LAYER_NAMES = {0: "config/foundation", 1: "pieces", 2: "workers", 3: "runners"}

# Upward imports that exist today and are scheduled to go; no new entry may be added. Empty: every layer
# imports only its own and the ones below (the eval sections moved to config/, their disk checks to validation/).
KNOWN_UPWARD: set[tuple[str, str]] = set()


def module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package (packages by their ``__init__``)."""
    modules = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The module an import name lands in: itself, or the nearest enclosing module (``pkg.Name``)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_edges(modules: dict[str, Path]) -> dict[tuple[str, str], int]:
    """``(importer, imported module) -> first line`` for every import of the package."""
    edges: dict[tuple[str, str], int] = {}
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: resolve against the importer's package
                    anchor = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
                    base = ".".join(anchor + ([base] if base else []))
                # ``from pkg import sub`` imports the submodule ``pkg.sub`` when there is one
                targets = [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in targets:
                if target != PACKAGE and not target.startswith(PACKAGE + "."):
                    continue
                resolved = _resolve(target, modules)
                if resolved is not None and resolved != module:
                    edges.setdefault((module, resolved), node.lineno)
    return edges


def layer_of(module: str) -> int:
    part = module.split(".")[1] if "." in module else "__init__"
    assert part in LAYERS, f"{module}: no layer for '{part}'; add it to LAYERS here and to docs/architecture.md"
    return LAYERS[part]


def package_of(module: str, modules: dict[str, Path]) -> str:
    return module if modules[module].name == "__init__.py" else module.rpartition(".")[0]


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def test_the_scan_sees_the_imports_it_must_judge() -> None:
    """Guard against a scan that finds nothing (and so passes anything): known edges are seen."""
    edges = import_edges(module_files())
    assert ("rlinf_cosmos3.checkpoint.save", "rlinf_cosmos3.components.ema") in edges
    assert ("rlinf_cosmos3.checkpoint.load", "rlinf_cosmos3.checkpoint._dist") in edges  # from pkg import sub
    assert ("rlinf_cosmos3.sim.client", "rlinf_cosmos3.paths") in edges  # from rlinf_cosmos3 import paths
    assert ("rlinf_cosmos3.workers.rollout.factory", "rlinf_cosmos3.workers.rollout.embedded") in edges  # lazy
    assert ("rlinf_cosmos3.workers.rollout.adapter", "rlinf_cosmos3.workers.rollout.backend") in edges  # TYPE_CHECKING
    assert len(edges) > 150


def test_no_module_imports_a_higher_layer() -> None:
    modules = module_files()
    edges = import_edges(modules)
    upward = {
        (src, dst): line for (src, dst), line in edges.items()
        if layer_of(dst) > layer_of(src) and (src, dst) not in KNOWN_UPWARD
    }
    report = "\n".join(
        f"  {modules[src].relative_to(ROOT.parent)}:{line}: {src} ({LAYER_NAMES[layer_of(src)]}) imports "
        f"{dst} ({LAYER_NAMES[layer_of(dst)]})"
        for (src, dst), line in sorted(upward.items())
    )
    assert not upward, (
        f"imports of a higher layer:\n{report}\nmove what is shared down a layer (see docs/architecture.md) "
        "or take it as an argument"
    )


def test_known_exceptions_still_exist() -> None:
    """An exception that no longer occurs must leave the list, so nothing can come back unnoticed."""
    edges = import_edges(module_files())
    stale = sorted(pair for pair in KNOWN_UPWARD if pair not in edges)
    assert not stale, f"these imports are gone: delete them from KNOWN_UPWARD in tests/test_layers.py: {stale}"


def test_no_import_cycles_between_packages() -> None:
    modules = module_files()
    graph: dict[str, set[str]] = defaultdict(set)
    for (src, dst) in import_edges(modules):
        if (src, dst) in KNOWN_UPWARD:
            continue
        a, b = package_of(src, modules), package_of(dst, modules)
        if a != b:
            graph[a].add(b)
    cycles = find_cycles(graph)
    assert not cycles, f"packages that import each other (directly or through others): {cycles}"


def test_no_import_cycles_between_modules() -> None:
    graph: dict[str, set[str]] = defaultdict(set)
    for (src, dst) in import_edges(module_files()):
        graph[src].add(dst)
    cycles = find_cycles(graph)
    assert not cycles, (
        f"modules that import each other (directly or through others): {cycles}; move what both need "
        "into a module that imports neither"
    )


CONFIG_MODULES = ("rlinf_cosmos3.config.sft", "rlinf_cosmos3.config.eval", "rlinf_cosmos3.config.rollout",
                  "rlinf_cosmos3.config.replay", "rlinf_cosmos3.config.env", "rlinf_cosmos3.config.data",
                  "rlinf_cosmos3.config.cluster", "rlinf_cosmos3.config.rl", "rlinf_cosmos3.config.rl_env",
                  "rlinf_cosmos3.validation.sft", "rlinf_cosmos3.validation.eval", "rlinf_cosmos3.validation.rl")
HEAVY = ("torch", "ray", "diffusers", "transformers", "lerobot", "av", "sglang")


def test_loading_a_config_imports_no_heavy_package() -> None:
    """Configs are read (and rejected) before anything starts: in a fresh interpreter, importing every
    config schema imports none of the packages that take seconds to import or need a GPU stack."""
    code = (f"import sys\nfor m in {CONFIG_MODULES!r}: __import__(m)\n"
            f"print(sorted(p for p in {HEAVY!r} if p in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=ROOT.parent)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", f"heavy packages imported by loading the configs: {out.stdout.strip()}"
