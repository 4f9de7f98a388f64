"""``verl export <checkpoint dir> <output dir>``: a training checkpoint as a Hugging Face folder.

The checkpoint's ``trainer_state.json`` names the base model folder (architecture and tokenizer) and
the training backend; that backend's engine is built in this process (a one-process group), loads the
sharded checkpoint (saved on any number of ranks) and writes safetensors, config, tokenizer and
generation config. A LoRA checkpoint (adapters only) is exported merged into the base model, or with
``adapter_only`` as a PEFT adapter folder (``PeftModel.from_pretrained(base, folder)``).

Nothing is lost to an export: the model is written to a new folder beside the target and moved into place
when complete. A target that holds files is refused (:class:`ExportTargetError`) unless ``overwrite``; and
even then a target that is the checkpoint, holds it (the run folder, or a parent of it) or lies inside it is
refused, since replacing it would delete the checkpoint or damage it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from verl.algos.run import checkpoint_layout as layout
from verl.algos.workers.engine_config import engine_config
from verl.core.config import ConfigError
from verl.core.engine import LANGUAGE_MODEL, VALUE_MODEL, EngineRegistry

logger = logging.getLogger(__name__)


class ExportTargetError(ValueError):
    """The export's output folder cannot be written without losing or damaging something."""


def check_target(checkpoint: Path, out: Path, overwrite: bool) -> None:
    """``out`` may receive the export of ``checkpoint``: new or empty, or (``overwrite``) anything that
    neither holds the checkpoint nor lies inside it."""
    run_folder = checkpoint.parent
    if out == checkpoint or out in checkpoint.parents:
        what = (
            "the checkpoint itself"
            if out == checkpoint
            else (
                "the run folder that holds the checkpoint"
                if out == run_folder
                else "a folder that holds the checkpoint"
            )
        )
        raise ExportTargetError(
            f"output folder {out} is {what} ({checkpoint}); exporting there would delete it. Give a new folder, "
            f"e.g. {run_folder / 'hf_export'}"
        )
    if checkpoint in out.parents:
        raise ExportTargetError(
            f"output folder {out} is inside the checkpoint {checkpoint}; files added there make the checkpoint fail "
            f"its integrity check. Give a folder outside it, e.g. {run_folder / 'hf_export'}"
        )
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise ExportTargetError(f"output folder {out} exists and is not a folder; give a new folder")
    held = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if held and not overwrite:
        shown = ", ".join(held[:5]) + (", ..." if len(held) > 5 else "")
        raise ExportTargetError(
            f"output folder {out} is not empty (it holds {shown}); verl export does not replace files it did not "
            "write. Give a new or empty folder, or pass --overwrite to replace what it holds"
        )
    if overwrite and held:
        runs = [name for name in held if name.startswith("global_step_") or name == layout.LATEST_FILE]
        if runs or not {"config.json", "adapter_config.json"} & set(held):
            what = f"a training run's checkpoints ({', '.join(runs[:3])})" if runs else "no config.json"
            raise ExportTargetError(
                f"output folder {out} holds {what}: it is not an earlier export, and --overwrite replaces only a "
                "Hugging Face model folder. Give another folder"
            )


def export_checkpoint(
    checkpoint_dir: str, output_dir: str, role: str = "actor", overwrite: bool = False, adapter_only: bool = False
) -> str:
    """Export ``<checkpoint_dir>/<role>`` (``checkpoint_dir``: a global_step_<N> folder or the role
    folder inside it) to ``output_dir`` (new or empty; with ``overwrite``, replacing what it holds);
    returns the output folder. ``adapter_only``: a LoRA checkpoint's adapter as a PEFT folder."""
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
    out = Path(output_dir).expanduser().resolve()
    check_target(folder, out, overwrite)
    layout.verify_checkpoint(folder)  # every file against the manifest, before any is read
    state = layout.read_trainer_state(folder)
    model_type = VALUE_MODEL if role == "critic" else LANGUAGE_MODEL
    engine_cls = EngineRegistry.get(model_type, state.get("strategy", "fsdp2"))
    values: dict = {"model_path": state["model_path"]}
    lora = saved_lora_config(folder / role)
    if lora:
        values["lora"] = lora
    elif adapter_only:
        raise ConfigError(f"{folder / role} is not a LoRA checkpoint: --adapter-only needs one (model.lora_rank > 0)")
    engine = engine_cls(engine_config(engine_cls.config_class, values))
    engine.initialize()
    engine.load_checkpoint(str(folder / role))
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.export-", dir=out.parent))
    try:
        # the engine writes <path>.tmp, then renames: both are ours
        if adapter_only:
            engine.export_adapter(str(staging / "model"))
        else:
            engine.export_hf(str(staging / "model"))
        _move_into_place(staging / "model", out, staging)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # only what this export created
    logger.info("exported %s to %s", folder / role, out)
    return str(out)


def saved_lora_config(role_folder: Path) -> dict | None:
    """The LoRA settings an engine checkpoint was saved with (None: a full model)."""
    from verl.engines.fsdp.checkpoint import ENGINE_STATE_FILE

    state_file = role_folder / ENGINE_STATE_FILE
    if not state_file.is_file():
        return None
    lora = json.loads(state_file.read_text()).get("extra", {}).get("lora")
    return lora if lora and lora.get("lora_rank") else None


def _move_into_place(model: Path, out: Path, staging: Path) -> None:
    """``out`` becomes ``model``: an empty ``out`` is replaced; a full one (``--overwrite``, checked) is moved
    into ``staging`` first and goes with it once the new folder is in place."""
    if out.is_dir() and any(out.iterdir()):
        os.replace(out, staging / "replaced")
    elif out.is_dir():
        out.rmdir()
    os.replace(model, out)
