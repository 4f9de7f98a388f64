"""``verl sft [key.path=value ...]``: the same checks before Ray starts as ``verl train`` (config values, the
model and tokenizer folders, every dataset row, the tracking packages, the run folder and where the run
starts), the run folder's lock, then the trainer."""

from __future__ import annotations

from verl.algos.config.sft_schema import SFTConfig
from verl.algos.config.verl_compat import VerlKeys
from verl.algos.data.sft_dataset import _lookup
from verl.algos.run import folder_lock as run_folder_lock
from verl.algos.run.log import log_to_run_folder, note_failure
from verl.algos.run.start import RunStart, plan_start
from verl.algos.trainer.main import what_is_kept
from verl.algos.trainer.model_checks import check_sft_models
from verl.algos.trainer.preflight import check_loggers, check_run_folder
from verl.core.config import ConfigError, build_config


def build_sft_trainer(cfg: SFTConfig, start: RunStart | None = None):
    """The SFT trainer with its data loaded; every check that needs no worker, before Ray starts."""
    from verl.algos.trainer.sft_trainer import SFTTrainer

    check_loggers(cfg.trainer.logger)
    check_run_folder(cfg.trainer.default_local_dir)
    model_path = check_sft_models(cfg)
    if start is None:
        plan_start(cfg.trainer)
    trainer = SFTTrainer(cfg, model_path)
    try:
        trainer.setup_data()
        check_sft_data(trainer)
    except (FileNotFoundError, ValueError) as exc:
        raise ConfigError(str(exc)) from None
    return trainer


def check_sft_data(trainer) -> None:
    """Every training and validation row has its response, and the training set fills a batch."""
    cfg = trainer.config
    for key, dataset in (("data.train_files", trainer.train_set), ("data.val_files", trainer.val_set)):
        if len(dataset) == 0:
            raise ValueError(f"{key}: no rows left after filtering; check the files and data.max_prompt_length")
        for index in range(len(dataset)):
            response = _lookup(dataset.prompts.raw_row(index), dataset.response_key)
            if not isinstance(response, str) or not response:
                raise ValueError(
                    f"{key}, row {index}: data.response_key={dataset.response_key!r} holds {response!r}, not a "
                    "non-empty string; point data.response_key at the target text (dotted for nested fields)"
                )
    if trainer.total_steps <= 0:
        raise ValueError(
            f"the training set has {len(trainer.train_set)} rows, fewer than data.train_batch_size="
            f"{cfg.data.train_batch_size}, so not one step can train; lower data.train_batch_size or add rows"
        )


def run_sft(cfg: SFTConfig) -> str:
    with run_folder_lock.acquire(cfg.trainer.default_local_dir) as lock:
        start = plan_start(cfg.trainer)
        start.apply(lock)
        log = log_to_run_folder(cfg.trainer.default_local_dir)
        try:
            trainer = build_sft_trainer(cfg, start)
            try:
                trainer.start()
                trainer.fit()
                return trainer.export()
            finally:
                trainer.close()
        except BaseException as exc:
            note_failure(log, exc, what_is_kept(cfg.trainer.default_local_dir))
            raise


def sft(overrides: list[str]) -> int:
    verl_keys = VerlKeys("sft")  # verl's fsdp_sft_trainer keys (model.partial_pretrain, ...)
    cfg = build_config(SFTConfig, overrides=overrides, foreign=verl_keys)
    verl_keys.log()
    print(f"exported: {run_sft(cfg)}")
    return 0
