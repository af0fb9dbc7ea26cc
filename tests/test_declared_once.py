"""Shared constants are declared in one module of the library and imported everywhere else (issue #33).

Every module under ``rlinf_cosmos3/`` is parsed with ``ast`` (nothing is imported): a module-level
assignment of a listed name is a declaration. The test fails when a listed name is declared in more
than one module (a second copy that can drift), or in none (renamed or moved: update the list). An
``import`` of the name, with or without ``as``, is not a declaration.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "rlinf_cosmos3"

# name -> the one module (relative to rlinf_cosmos3/) that declares it
DECLARED_ONCE: dict[str, str] = {
    "ATTENTION_BACKENDS": "config/sft.py",
    "ACTION_DIM": "config/libero_suites.py",  # the 7-D LIBERO command / stored action
    "STATE_DIM": "config/libero_suites.py",  # the 8-D robot state
}


def _assigned_names(tree: ast.Module) -> set[str]:
    """Names bound by assignments in the module body (also under a module-level ``if`` or ``try``)."""
    names: set[str] = set()
    stack: list[ast.stmt] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        elif isinstance(node, (ast.If, ast.Try)):
            stack.extend(node.body + node.orelse + getattr(node, "finalbody", []))
            for handler in getattr(node, "handlers", []):
                stack.extend(handler.body)
            continue
        else:
            continue
        for target in targets:
            for sub in ast.walk(target):
                if isinstance(sub, ast.Name):
                    names.add(sub.id)
    return names


def declarations() -> dict[str, list[str]]:
    """Listed name -> the modules (paths relative to ``rlinf_cosmos3/``) that assign it at module level."""
    found: dict[str, list[str]] = {name: [] for name in DECLARED_ONCE}
    for path in sorted(ROOT.rglob("*.py")):
        assigned = _assigned_names(ast.parse(path.read_text(), filename=str(path)))
        for name in found.keys() & assigned:
            found[name].append(path.relative_to(ROOT).as_posix())
    return found


def test_the_scan_sees_declarations_and_not_imports() -> None:
    tree = ast.parse("import x\nfrom y import A as B\nC = 1\nD: int = 2\nif x:\n    E, F = 3, 4\n"
                     "def g():\n    H = 5\n")
    assert _assigned_names(tree) == {"C", "D", "E", "F"}


def test_each_shared_constant_is_declared_in_one_module() -> None:
    found = declarations()
    wrong = {name: modules for name, modules in found.items() if modules != [DECLARED_ONCE[name]]}
    assert not wrong, (
        "each of these must be assigned at module level in exactly the listed module and imported "
        f"elsewhere: {wrong} (expected {dict((n, DECLARED_ONCE[n]) for n in wrong)})"
    )
