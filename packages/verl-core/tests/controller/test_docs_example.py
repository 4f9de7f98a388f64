"""The worked example of docs/controller.md runs as written (so the page cannot drift from the code)."""

from __future__ import annotations

import re
import types
from pathlib import Path

DOC = Path(__file__).resolve().parents[4] / "docs" / "controller.md"


def _worked_example() -> str:
    text = DOC.read_text()
    section = text.split("## A worked example", 1)[1]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1, "the worked example should be one python block"
    return blocks[0]


def test_the_worked_example_in_the_docs_runs(ray_local):
    # A module that is not importable by name, so Ray ships its classes to the workers by value.
    module = types.ModuleType("controller_docs_example")
    exec(compile(_worked_example(), str(DOC), "exec"), module.__dict__)
    assert module.group.world_size == 2
    assert {m["loss"] >= 0 for m in module.metrics} == {True}
