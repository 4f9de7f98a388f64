"""The layering of docs/design.md, checked on the source (every import, module-level or inside a function):

- no code outside the platform packages calls a vendor device API (``torch.cuda``, ``torch.npu``,
  ``torch_npu``): it asks the current platform;
- dependencies point one way: ``verl.core`` imports nothing of ``verl.engines``, ``verl.algos`` or a
  platform package; ``verl.engines`` nothing of ``verl.algos``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ROOT / "packages"
VENDOR_API = re.compile(r"\btorch\.(cuda|npu)\b|\btorch_npu\b")
#: package folder -> the verl namespaces its code may not import
FORBIDDEN_IMPORTS = {
    "verl-core": ("verl.engines", "verl.algos", "verl.platforms"),
    "verl-engines": ("verl.algos",),
}


def source_files(package: str) -> list[Path]:
    return sorted((PACKAGES / package / "src").rglob("*.py"))


def code_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of the lines that are code: comments and docstrings do not count."""
    tree = ast.parse(path.read_text())
    doc_lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            doc_lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return [
        (number, line.split("#", 1)[0])
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if number not in doc_lines
    ]


def imported_modules(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


def non_platform_packages() -> list[str]:
    return sorted(p.name for p in PACKAGES.iterdir() if p.is_dir() and not p.name.startswith("verl-platform-"))


@pytest.mark.parametrize("package", non_platform_packages())
def test_no_vendor_device_api_outside_the_platform_packages(package):
    offenders = []
    for path in source_files(package):
        if "/verl/core/platform/" in path.as_posix():
            continue  # the platform interface itself
        offenders += [f"{path.relative_to(ROOT)}:{n}: {t.strip()}" for n, t in code_lines(path) if VENDOR_API.search(t)]
    assert offenders == [], "ask verl.core.platform.get_platform() instead:\n" + "\n".join(offenders)


@pytest.mark.parametrize("package", sorted(FORBIDDEN_IMPORTS))
def test_dependencies_point_one_way(package):
    forbidden = FORBIDDEN_IMPORTS[package]
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: imports {module}"
        for path in source_files(package)
        for line, module in imported_modules(path)
        if module.startswith(forbidden)
    ]
    assert offenders == []


def test_the_checks_see_the_code():
    """Guards against a scan that silently finds nothing (a moved folder)."""
    assert len(source_files("verl-core")) > 20 and len(source_files("verl-engines")) > 20
    assert any(
        module == "torch" for _, module in imported_modules(PACKAGES / "verl-engines/src/verl/engines/fsdp/engine.py")
    )
