"""docs/design.md stays true: every name it quotes in `backticks` exists in the code.

Checked, outside fenced code blocks (diagrams):
- ``verl.x.y`` paths (also ``@verl.x.y``, ``verl.x.y()`` and ``verl.x.y(a, key=...)``): the longest
  importable module prefix is imported and the rest looked up with getattr; keyword arguments written in
  the call must be parameters of the callable;
- ``Name.member`` where ``Name`` is a class or module quoted in full elsewhere on the page
  (``PPOTrainer.start_workers`` once ``verl.algos.trainer.ppo_trainer.PPOTrainer`` is quoted);
- repository paths (``packages/...``, ``docs/...``, ``tests/...``, ``examples/...``, ``ci/...``,
  ``benchmarks/...``): the file or folder exists;
- run-config keys (``trainer.logger``, ``algorithm.adv_estimator=...``): the key is in the schema;
- relative markdown links: the target exists.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "design.md"

DOTTED = re.compile(r"^@?(verl(?:\.\w+)+)(\((.*)\))?$")
MEMBER = re.compile(r"^@?([A-Z]\w*)\.(\w+)(\(.*\))?$")
REPO_PATH = re.compile(r"^(?:packages|docs|tests|examples|ci|benchmarks)/[\w./-]*$")
CONFIG_KEY = re.compile(
    r"^((?:data|actor_rollout_ref|critic|reward_model|custom_reward_function|algorithm|trainer)(?:\.\w+)+)(=.*)?$"
)
LINK = re.compile(r"\]\(([^)\s]+)\)")

#: Dotted names on the page that are not Python objects, and the constant that must spell them.
NOT_MODULES = {"verl.plugins": ("verl.core.plugins", "ENTRY_POINT_GROUP")}


def prose(text: str) -> str:
    """The page without its fenced code blocks (diagrams and layouts are drawn, not quoted)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def quoted(text: str) -> list[str]:
    # `a \| b` is a pipe escaped for a markdown table cell
    return [q.replace("\\|", "|").strip() for q in re.findall(r"`([^`\n]+)`", prose(text))]


def resolve(path: str) -> Any:
    """The object at a dotted path: the longest importable module prefix, then attributes."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            # Only "this prefix is not a module" means try a shorter one; a module that exists but fails
            # to import (a missing dependency) is an error of its own.
            if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
                continue
            raise
        for attr in parts[cut:]:
            obj = getattr(obj, attr)  # AttributeError names what is missing
        return obj
    raise ModuleNotFoundError(f"no module on the path {path!r}")


def keyword_arguments(call: str) -> list[str]:
    """Names of the ``key=value`` arguments in ``a, key=[x, y], *args`` (brackets nest)."""
    names, depth, current = [], 0, ""
    for char in call + ",":
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        if char == "," and depth == 0:
            match = re.match(r"^\s*(\w+)\s*=", current)
            if match:
                names.append(match.group(1))
            current = ""
        else:
            current += char
    return names


def check_call(obj: Any, call: str, token: str) -> None:
    names = keyword_arguments(call)
    if not names or not callable(obj):
        return
    params = inspect.signature(obj).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    missing = [n for n in names if n not in params]
    assert not missing, f"`{token}`: {obj!r} takes no argument(s) {missing}; its parameters: {list(params)}"


def test_the_page_exists_and_is_found_by_its_checks():
    """Guards against checks that silently find nothing (a renamed file, a broken extraction)."""
    tokens = quoted(DOC.read_text())
    assert sum(bool(DOTTED.match(t)) for t in tokens) > 50
    assert sum(bool(REPO_PATH.match(t)) for t in tokens) > 5
    assert sum(bool(CONFIG_KEY.match(t)) for t in tokens) > 5


def test_quoted_python_names_exist():
    tokens = quoted(DOC.read_text())
    problems: list[str] = []
    known: dict[str, Any] = {}
    for token in tokens:
        match = DOTTED.match(token)
        if not match:
            continue
        path, _, call = match.groups()
        if path in NOT_MODULES:
            module, constant = NOT_MODULES[path]
            if getattr(importlib.import_module(module), constant) != path:
                problems.append(f"`{token}`: {module}.{constant} is no longer {path!r}")
            continue
        try:
            obj = resolve(path)
            if call is not None:
                check_call(obj, call, token)
        except (ImportError, AttributeError, AssertionError) as exc:
            problems.append(f"`{token}`: {type(exc).__name__}: {exc}")
            continue
        known[path.rsplit(".", 1)[-1]] = obj
    for token in tokens:
        match = MEMBER.match(token)
        if not match or match.group(1) not in known:
            continue
        name, member, call = match.groups()
        if not hasattr(known[name], member):
            problems.append(f"`{token}`: {name} has no attribute {member!r}")
        elif call is not None:
            try:
                check_call(getattr(known[name], member), call[1:-1], token)
            except AssertionError as exc:
                problems.append(str(exc))
    assert problems == [], "docs/design.md quotes names the code does not have:\n" + "\n".join(problems)


def test_quoted_repository_paths_exist():
    missing = [t for t in quoted(DOC.read_text()) if REPO_PATH.match(t) and not (ROOT / t).exists()]
    assert missing == [], f"docs/design.md quotes paths that do not exist: {missing}"


def test_quoted_config_keys_are_in_the_schema():
    from verl.algos.config.schema import PPOConfig
    from verl.core.config import schema_keys

    keys = set(schema_keys(PPOConfig))
    unknown = [t for t in quoted(DOC.read_text()) if (m := CONFIG_KEY.match(t)) and m.group(1) not in keys]
    assert unknown == [], f"docs/design.md quotes config keys the schema does not have: {unknown}"


@pytest.mark.parametrize("page", ["docs/design.md", "README.md"])
def test_relative_links_resolve(page):
    path = ROOT / page
    targets = [t.split("#", 1)[0] for t in LINK.findall(path.read_text())]
    broken = [t for t in targets if t and "://" not in t and not (path.parent / t).exists()]
    assert broken == [], f"{page} links to files that do not exist: {broken}"


def test_the_readme_links_the_design_in_the_repository():
    readme = (ROOT / "README.md").read_text()
    assert "(docs/design.md)" in readme
    assert "shared/DESIGN.md" not in readme
