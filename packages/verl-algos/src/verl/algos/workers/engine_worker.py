"""What every role worker around a training engine shares: host seeding, the model folder, building the
engine from its typed config, data-parallel coordinates from it, and the checkpoint calls the run loop
makes on each role."""

from __future__ import annotations

from typing import Any

from verl.algos.workers.engine_config import training_engine_config
from verl.core.controller import Dispatch, Worker, register
from verl.core.seeding import seed_host_rngs


class EngineWorker(Worker):
    """``self.engine``: the training engine whose checkpoint and export stand for this role."""

    def __init__(self, config: Any):
        self.config = config
        self.engine: Any = None

    def begin_init(self, model_path: str) -> str:
        """Seeds Python's and numpy's RNGs from ``trainer.seed`` (as torch's) and resolves ``model_path``
        (a folder, or a model the zoo provides offline)."""
        seed_host_rngs(self.config.trainer.seed)
        from verl.engines.model_zoo import resolve_model_path

        return resolve_model_path(model_path)

    def build_engine(self, engine_cls: type, values: dict[str, Any], strategy: str) -> Any:
        """An initialized engine of ``engine_cls`` from the role's ``values``; model-parallel engines
        (megatron: TP x PP ranks per data-parallel replica) give every rank of a replica its shard and
        return the outputs from one of them."""
        engine = engine_cls(training_engine_config(engine_cls.config_class, values, strategy))
        engine.initialize()
        self.set_dp_info(engine.dp_rank, engine.dp_size, engine.is_collect_rank)
        return engine

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        self.engine.save_checkpoint(path)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        self.engine.load_checkpoint(path)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def export_hf(self, path: str) -> None:
        self.engine.export_hf(path)
