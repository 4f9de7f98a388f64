"""Checks of a run's surroundings that need no worker, run before Ray starts by ``verl train``, ``verl sft``
and ``verl config show``: the tracking backends' packages and the run folder. (The config values, the model
folders, the data and the resume checkpoint have their own checks; see ``main.build_trainer``.)"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

from verl.core.config import ConfigError

#: trainer.logger backend -> (the modules it imports, the extra that installs them)
LOGGER_PACKAGES = {
    "wandb": (("wandb",), "pip install 'verl-algos[wandb]'"),
    "mlflow": (("mlflow",), "pip install 'verl-algos[mlflow]'"),
    "tensorboard": (("tensorboard", "torch.utils.tensorboard"), "pip install tensorboard"),
}


def check_loggers(backends: list[str], key: str = "trainer.logger") -> None:
    """Every backend in ``trainer.logger`` can be imported (a missing package otherwise stops the run after
    the workers have loaded the model)."""
    for backend in backends:
        modules, install = LOGGER_PACKAGES.get(backend, ((), ""))
        for module in modules:
            try:
                importlib.import_module(module)
            except ImportError as exc:
                raise ConfigError(
                    f"{key} includes {backend!r}, but its package cannot be imported ({type(exc).__name__}: {exc}); "
                    f"{install}, or drop {backend!r} from {key}"
                ) from None


def check_run_folder(folder: str, key: str = "trainer.default_local_dir") -> None:
    """``folder`` is a writable folder or can be created (reads only: ``verl config show`` creates nothing)."""
    path = Path(folder).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ConfigError(
                f"{key}={folder} is a file, not a folder; give a folder for the run's checkpoints and logs"
            )
        if not os.access(path, os.W_OK | os.X_OK):
            raise ConfigError(f"{key}={folder} is not writable by this user; give a writable location")
        return
    parent = path.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"{key}={folder} cannot be created: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(
            f"{key}={folder} cannot be created: {parent} is not writable by this user; give a writable location"
        )
