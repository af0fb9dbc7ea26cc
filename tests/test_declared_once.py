"""Shared constants are declared in one module of the library and imported everywhere else (issue #33).

Every module under ``rlinf_cosmos3/`` is parsed with ``ast`` (nothing is imported): a module-level
assignment of a listed name is a declaration. The test fails when a listed name is declared in more
than one module (a second copy that can drift), or in none (renamed or moved: update the list). An
``import`` of the name, with or without ``as``, is not a declaration. Beyond the list, no upper-case
name may be assigned the same literal value in two modules (an unlisted copy). And no field of the
training objective is declared by two of the schemas that carry it (the SFT ``actor`` sections, the
policy's config): the objective is one dataclass, ``config/objective.py``'s.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "rlinf_cosmos3"

# name -> the one module (relative to rlinf_cosmos3/) that declares it
DECLARED_ONCE: dict[str, str] = {
    "ATTENTION_BACKENDS": "config/objective.py",
    "SIGMA_DISTRIBUTIONS": "config/objective.py",
    "ACTION_DIM": "config/libero_suites.py",  # the 7-D LIBERO command / stored action
    "STATE_DIM": "config/libero_suites.py",  # the 8-D robot state
    "PRECISIONS": "config/base.py",  # the precision names; parallelize's torch dtypes are PRECISION_DTYPES
    "LATENT_KEY": "data/latent_cache.py",  # batch keys the cache writes and the policy's processor reads
    "LATENT_VALID_KEY": "data/latent_cache.py",
    # two different process tags, once both named TAG_ENV: each has a name of its own
    "ONLINE_EVAL_TAG_ENV": "runners/online_eval.py",
    "SERVER_TAG_ENV": "workers/rollout/server_process.py",
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


def _literal_constants(tree: ast.Module) -> dict[str, object]:
    """Upper-case names the module body assigns a literal (``X = "a"``, ``X: int = 2``), with the value."""
    found: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if isinstance(target, ast.Name) and re.fullmatch(r"_?[A-Z][A-Z0-9_]*", target.id):
            try:
                found[target.id] = ast.literal_eval(value)
            except ValueError:  # not a literal (a call, a name): not comparable here
                continue
    return found


def test_no_constant_is_copied_under_its_name() -> None:
    """Two modules that assign one upper-case name the same literal hold a copy: declare it once, import it."""
    seen: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path in sorted(ROOT.rglob("*.py")):
        for name, value in _literal_constants(ast.parse(path.read_text(), filename=str(path))).items():
            seen[(name, repr(value))].append(path.relative_to(ROOT).as_posix())
    copies = {name: modules for (name, _), modules in seen.items() if len(modules) > 1}
    assert not copies, f"the same constant assigned in several modules (keep one, import it): {copies}"


def test_the_copy_scan_sees_literals_only() -> None:
    tree = ast.parse("A = 'x'\nB: int = 2\nC = f()\nlower = 1\n_D = (1, 2)\nif x:\n    E = 3\n")
    assert _literal_constants(tree) == {"A": "x", "B": 2, "_D": (1, 2)}


FIELDS_IN_TWO_SCHEMAS = {
    "precision": "the policy's is the dtype the noisy tokens enter in (None: the parameters'); an SFT rank passes "
                 "actor.model.precision on GPU, fp32 on CPU",
    "max_tokens_per_pack": "actor.max_tokens_per_pack is a key of the actor section, not of actor.model; both "
                           "default to config.sft.DEFAULT_MAX_TOKENS_PER_PACK",
}
"""Field names two schemas below may both declare, with the reason; the list may only shrink."""


def _own_fields(cls: type) -> set[str]:
    """Fields a dataclass declares in its own body (not the ones it inherits)."""
    return set(vars(cls).get("__annotations__", {}))


def test_no_objective_field_is_declared_in_two_schemas() -> None:
    """``actor.model`` inherits the objective and the policy holds it: a field copied into either fails here."""
    from rlinf_cosmos3.config.model_settings import ModelSettings
    from rlinf_cosmos3.config.objective import ObjectiveConfig
    from rlinf_cosmos3.config.sft import ActorConfig, ModelConfig
    from rlinf_cosmos3.models.cosmos3.configuration import PolicyConfig

    assert issubclass(ModelConfig, ObjectiveConfig)
    schemas = (ObjectiveConfig, ModelConfig, ActorConfig, PolicyConfig)
    owners: dict[str, list[str]] = defaultdict(list)
    for cls in schemas:
        for name in _own_fields(cls):
            owners[name].append(cls.__name__)
    # The model settings are ModelSettings' (the policy inherits them, fps as a float); actor.model states each
    # as a key of its own, listed in SFT_SETTING_KEYS and checked by tests/test_model_identity.py.
    settings = _own_fields(ModelSettings)
    twice = {name: classes for name, classes in owners.items()
             if len(classes) > 1 and name not in settings and name not in FIELDS_IN_TWO_SCHEMAS}
    assert not twice, f"fields declared in two schemas (declare each once, in config/): {twice}"
    stale = sorted(name for name in FIELDS_IN_TWO_SCHEMAS if len(owners.get(name, [])) < 2)
    assert not stale, f"no longer declared twice: delete them from FIELDS_IN_TWO_SCHEMAS: {stale}"
