"""Tracking backends (``trainer.logger``): each a small class registered by name."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from verl.core.registry import Registry


@dataclass
class RunInfo:
    project: str
    experiment: str
    local_dir: str  # trainer.default_local_dir: where file outputs go
    config: dict[str, Any]
    total_steps: int | None = None


class TrackerBackend:
    """One destination for metrics. ``log`` gets every metric of one training step."""

    def __init__(self, run: RunInfo):
        self.run = run

    def log(self, metrics: dict[str, float], step: int) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        """Flush and close. Called once, also when the run stops on an error."""


#: name -> TrackerBackend subclass
TRACKERS: Registry[type[TrackerBackend]] = Registry("tracking backend")


def import_tracker_package(name: str) -> ModuleType:
    """The tracking package ``name`` (the extra of the same name installs it), or an error that says how
    to install it."""
    try:
        return importlib.import_module(name)
    except ImportError:
        raise ImportError(
            f"trainer.logger includes {name!r} but {name} is not installed: pip install 'verl-algos[{name}]'"
        ) from None
