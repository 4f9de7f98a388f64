"""Interactions (user simulators) an agent loop consults between turns: the contract (:mod:`.base`),
verl's YAML interaction config (:mod:`.config`), running replies safely (:mod:`.execution`) and the
built-in gsm8k interaction."""

from verl.algos.agent.interactions.base import INTERACTION_CLASSES, BaseInteraction, InteractionReply
from verl.algos.agent.interactions.config import build_interactions, load_interactions
from verl.algos.agent.interactions.execution import InteractionRunner

__all__ = [
    "INTERACTION_CLASSES",
    "BaseInteraction",
    "InteractionReply",
    "InteractionRunner",
    "build_interactions",
    "load_interactions",
]
