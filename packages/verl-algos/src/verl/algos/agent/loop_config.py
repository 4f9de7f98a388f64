"""verl's agent-loop config file (``actor_rollout_ref.rollout.agent.agent_loop_config_path``): agent loops
by name, each a class path and its keyword arguments::

    - name: my_agent
      _target_: my_package.loops.MyAgentLoop    # a subclass of verl.algos.agent.loops.AgentLoop
      max_retries: 2                            # passed to MyAgentLoop(context, max_retries=2)

A data row picks one with ``agent_name: my_agent``. The file is read in every rollout worker, so the loop's
module only has to be importable there (not registered in the driver).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import yaml

from verl.algos.agent.class_paths import import_class
from verl.algos.agent.loops import AgentLoop


def load_agent_loop_config(path: str) -> dict[str, Callable[..., AgentLoop]]:
    """Loop factories by name: ``factory(context)`` builds the loop."""
    with open(path, encoding="utf-8") as f:
        document = yaml.safe_load(f)
    return build_agent_loop_config(document, source=path)


def build_agent_loop_config(
    document: Any, source: str = "the agent loop config"
) -> dict[str, Callable[..., AgentLoop]]:
    if not isinstance(document, list):
        raise ValueError(f"{source}: expected a list of {{name, _target_, ...}} entries (verl's agent loop config)")
    factories: dict[str, Callable[..., AgentLoop]] = {}
    for index, entry in enumerate(document):
        where = f"{source}: [{index}]"
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("name"), str)
            or not isinstance(entry.get("_target_"), str)
        ):
            raise ValueError(f"{where}: each agent loop needs a name and a _target_ (the class's import path)")
        kwargs = {k: v for k, v in entry.items() if k not in ("name", "_target_")}
        if entry["name"] in factories:
            raise ValueError(f"{where}: a second agent loop named {entry['name']!r}; names must be unique")
        factories[entry["name"]] = functools.partial(
            import_class(entry["_target_"], AgentLoop, where, "_target_"), **kwargs
        )
    return factories
