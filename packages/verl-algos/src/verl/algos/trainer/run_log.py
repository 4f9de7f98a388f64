"""A run's log file, ``<trainer.default_local_dir>/train.log``: kept when a run stops, with the error."""

from __future__ import annotations

import logging
import os

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def log_to_run_folder(local_dir: str, name: str = "train.log") -> logging.Handler:
    os.makedirs(local_dir, exist_ok=True)
    path = os.path.abspath(os.path.join(local_dir, name))
    root = logging.getLogger()
    for handler in root.handlers:  # one handler per file, also when runs repeat in one process
        if isinstance(handler, logging.FileHandler) and handler.baseFilename == path:
            return handler
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter(FORMAT))
    root.addHandler(handler)
    return handler
