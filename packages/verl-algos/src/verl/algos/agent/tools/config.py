"""Reading verl's tool config (``multi_turn.tool_config_path``) and building its tools::

    tools:
      - class_name: verl.tools.gsm8k_tool.Gsm8kTool     # or a short name: gsm8k, calculator, code_interpreter
        config: {type: native}
        tool_schema:
          type: function
          function: {name: calc_gsm8k_reward, description: ..., parameters: {type: object, ...}}

``class_name`` is looked up in ``TOOL_CLASSES``; a dotted path that is not registered is imported (a
user's own tool, as in verl). ``builtin:<name>`` names a config shipped here (``builtin:calculator``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft7Validator
from jsonschema.exceptions import SchemaError

from verl.algos.agent.class_paths import registered_or_imported_class
from verl.algos.agent.tools import calculator, code_interpreter, gsm8k  # noqa: F401  (register the built-ins)
from verl.algos.agent.tools.base import TOOL_CLASSES, BaseTool

BUILTIN_PREFIX = "builtin:"
BUILTIN_DIR = Path(__file__).parent / "builtin"


def load_tools(path: str) -> dict[str, BaseTool]:
    """The tools of the YAML file ``path`` (or of the shipped ``builtin:<name>`` config), by function name."""
    if path.startswith(BUILTIN_PREFIX):
        path = str(builtin_tool_config(path[len(BUILTIN_PREFIX) :]))
    with open(path, encoding="utf-8") as f:
        document = yaml.safe_load(f)
    return build_tools(document, source=path)


def builtin_tool_config(name: str) -> Path:
    found = BUILTIN_DIR / f"{name}.yaml"
    if not found.is_file():
        names = ", ".join(sorted(p.stem for p in BUILTIN_DIR.glob("*.yaml")))
        raise ValueError(f"unknown built-in tool config {name!r}; built-in: {names} (or give a YAML path)")
    return found


def build_tools(document: Any, source: str = "the tool config") -> dict[str, BaseTool]:
    if not isinstance(document, dict) or not isinstance(document.get("tools"), list):
        raise ValueError(f"{source}: expected a mapping with a 'tools' list (see verl's tool config format)")
    tools: dict[str, BaseTool] = {}
    for index, entry in enumerate(document["tools"]):
        where = f"{source}: tools[{index}]"
        tool = _build_one(entry, where)
        if tool.name in tools:
            raise ValueError(f"{where}: a second tool named {tool.name!r}; function names must be unique")
        tools[tool.name] = tool
    return tools


def _build_one(entry: Any, where: str) -> BaseTool:
    if not isinstance(entry, dict) or not isinstance(entry.get("class_name"), str):
        raise ValueError(f"{where}: each tool needs a class_name (a registered name or an import path)")
    _check_schema(entry.get("tool_schema"), where)
    config = entry.get("config") or {}
    if not isinstance(config, dict):
        raise ValueError(f"{where}: config must be a mapping, got {type(config).__name__}")
    return tool_class(entry["class_name"], where)(config, entry["tool_schema"])


def _check_schema(schema: Any, where: str) -> None:
    function = schema.get("function") if isinstance(schema, dict) else None
    if not isinstance(schema, dict) or schema.get("type") != "function" or not isinstance(function, dict):
        raise ValueError(
            f"{where}: tool_schema must be {{type: function, function: {{name, description, parameters}}}}"
        )
    if not isinstance(function.get("name"), str) or not function["name"]:
        raise ValueError(f"{where}: tool_schema.function.name must be a non-empty string")
    parameters = function.get("parameters")
    if parameters is not None:
        try:
            Draft7Validator.check_schema(parameters)
        except SchemaError as e:
            raise ValueError(
                f"{where}: tool_schema.function.parameters is not a valid JSON schema: {e.message}"
            ) from None


def tool_class(class_name: str, where: str) -> type[BaseTool]:
    return registered_or_imported_class(TOOL_CLASSES, class_name, BaseTool, where)
