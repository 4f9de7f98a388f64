"""Reading verl's interaction config (``multi_turn.interaction_config_path``)::

    interaction:
      - name: gsm8k                                                     # optional: else from the class name
        class_name: verl.interactions.gsm8k_interaction.Gsm8kInteraction  # or a short name: gsm8k
        config: {}

``class_name`` is looked up in ``INTERACTION_CLASSES``; a dotted path that is not registered is imported
(a user's own interaction, as in verl). A data row picks its interaction with
``extra_info.interaction_kwargs.name``.
"""

from __future__ import annotations

from typing import Any

import yaml

from verl.algos.agent.class_paths import registered_or_imported_class
from verl.algos.agent.interactions import gsm8k  # noqa: F401  (registers the built-in)
from verl.algos.agent.interactions.base import INTERACTION_CLASSES, BaseInteraction


def load_interactions(path: str) -> dict[str, BaseInteraction]:
    """The interactions of the YAML file ``path``, by name."""
    with open(path, encoding="utf-8") as f:
        document = yaml.safe_load(f)
    return build_interactions(document, source=path)


def build_interactions(document: Any, source: str = "the interaction config") -> dict[str, BaseInteraction]:
    if not isinstance(document, dict) or not isinstance(document.get("interaction"), list):
        raise ValueError(f"{source}: expected a mapping with an 'interaction' list (see verl's interaction config)")
    interactions: dict[str, BaseInteraction] = {}
    for index, entry in enumerate(document["interaction"]):
        where = f"{source}: interaction[{index}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("class_name"), str):
            raise ValueError(f"{where}: each interaction needs a class_name (a registered name or an import path)")
        config = entry.get("config") or {}
        if not isinstance(config, dict):
            raise ValueError(f"{where}: config must be a mapping, got {type(config).__name__}")
        name = entry.get("name") or default_name(entry["class_name"])
        if name in interactions:
            raise ValueError(f"{where}: a second interaction named {name!r}; names must be unique")
        interactions[name] = interaction_class(entry["class_name"], where)({**config, "name": name})
    return interactions


def default_name(class_name: str) -> str:
    """verl's rule: the class's name without an ``Interaction`` suffix, lower-cased."""
    simple = class_name.rsplit(".", 1)[-1]
    return (simple[: -len("Interaction")] if simple.endswith("Interaction") else simple).lower()


def interaction_class(class_name: str, where: str) -> type[BaseInteraction]:
    return registered_or_imported_class(INTERACTION_CLASSES, class_name, BaseInteraction, where)
