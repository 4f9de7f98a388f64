"""``verl sft [key.path=value ...]``."""

from __future__ import annotations

from verl.algos.config.sft_schema import SFTConfig
from verl.algos.config.verl_compat import VerlKeys
from verl.algos.trainer.run_log import log_to_run_folder
from verl.core.config import ConfigError, build_config


def run_sft(cfg: SFTConfig) -> str:
    from verl.algos.trainer.sft_trainer import SFTTrainer
    from verl.engines.model_zoo import resolve_model_path

    try:
        model_path = resolve_model_path(cfg.model.path)
    except (FileNotFoundError, ModuleNotFoundError) as exc:
        raise ConfigError(f"model.path: {exc}") from None
    log_to_run_folder(cfg.trainer.default_local_dir)
    trainer = SFTTrainer(cfg, model_path)
    try:
        trainer.setup_data()
    except (FileNotFoundError, ValueError) as exc:
        raise ConfigError(str(exc)) from None
    try:
        trainer.start()
        return trainer.fit()
    finally:
        trainer.close()


def sft(overrides: list[str]) -> int:
    verl_keys = VerlKeys("sft")  # verl's fsdp_sft_trainer keys (model.partial_pretrain, ...)
    cfg = build_config(SFTConfig, overrides=overrides, foreign=verl_keys)
    verl_keys.log()
    print(f"exported: {run_sft(cfg)}")
    return 0
