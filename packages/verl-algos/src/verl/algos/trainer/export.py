"""``verl export <checkpoint dir> <output dir>``: a training checkpoint as a Hugging Face folder.

The checkpoint's ``trainer_state.json`` names the base model folder (architecture and tokenizer) and
the training backend; that backend's engine is built in this process (a one-process group), loads the
sharded checkpoint (saved on any number of ranks) and writes safetensors, config, tokenizer and
generation config.
"""

from __future__ import annotations

import logging
from pathlib import Path

from verl.algos.trainer import checkpoint_layout as layout
from verl.algos.workers.engine_config import fit_to
from verl.core.config import ConfigError
from verl.core.engine import EngineRegistry

logger = logging.getLogger(__name__)


def export_checkpoint(checkpoint_dir: str, output_dir: str, role: str = "actor") -> str:
    """Export ``<checkpoint_dir>/<role>`` (``checkpoint_dir``: a global_step_<N> folder or the role
    folder inside it); returns the output folder."""
    folder = Path(checkpoint_dir).expanduser().resolve()
    if folder.name == role and layout.is_complete(folder.parent):
        folder = folder.parent
    if not folder.is_dir():
        raise ConfigError(f"checkpoint folder {str(folder)!r} does not exist")
    if not layout.is_complete(folder):
        raise ConfigError(
            f"{str(folder)!r} is not a complete checkpoint (a global_step_<N> folder with {layout.COMPLETE_MARKER} "
            "and trainer_state.json); it may have been interrupted while being written"
        )
    layout.verify_checkpoint(folder)  # every file against the manifest, before any is read
    state = layout.read_trainer_state(folder)
    model_type = "value_model" if role == "critic" else "language_model"
    engine_cls = EngineRegistry.get(model_type, state.get("strategy", "fsdp2"))
    engine = engine_cls(fit_to(engine_cls.config_class, {"model_path": state["model_path"], "optim": {"lr": 0.0}}))
    engine.initialize()
    engine.load_checkpoint(str(folder / role))
    out = Path(output_dir).expanduser().resolve()
    engine.export_hf(str(out))
    logger.info("exported %s to %s", folder / role, out)
    return str(out)
