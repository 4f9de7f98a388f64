"""``RewardModelWorker``: a sequence-scoring reward model (a causal-LM backbone with a scalar head).

The score of a response is the head's output on its last token. The value engine aligns the value of
response token j with the position *before* j (the state that chooses j), so the worker appends one pad
token after each response and reads the value aligned with it: the head's output on the last real token.
"""

from __future__ import annotations

import torch

from verl.algos.config.schema import PPOConfig
from verl.algos.workers.engine_config import (
    engine_takes,
    megatron_setting,
    training_engine_values,
)
from verl.algos.workers.engine_worker import EngineWorker
from verl.core.controller import Dispatch, register
from verl.core.engine import VALUE_MODEL, EngineRegistry
from verl.core.protocol import DataProto
from verl.engines.optim_config import OptimConfig


class RewardModelWorker(EngineWorker):
    def __init__(self, config: PPOConfig):
        super().__init__(config)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        cfg = self.config.reward_model
        if not cfg.model.path:
            raise ValueError("reward_model.enable=true needs reward_model.model.path (a local sequence-scoring model)")
        model_path = self.begin_init(cfg.model.path)
        strategy = self.config.actor_rollout_ref.actor.strategy
        engine_cls = EngineRegistry.get(VALUE_MODEL, strategy)
        values = training_engine_values(
            model_path=model_path,
            model=cfg.model,
            model_key="reward_model.model",
            optim=OptimConfig(),  # scoring only: never steps
            fsdp_config=self.config.actor_rollout_ref.ref.fsdp_config,
            # the reference's section: offload and precision of a model that never trains
            megatron=(
                megatron_setting(self.config, "actor_rollout_ref.ref.megatron").value
                if engine_takes(engine_cls.config_class, "megatron")
                else None
            ),
            micro_batch_size=cfg.micro_batch_size_per_gpu,
            use_dynamic_bsz=False,
            max_token_len=1 << 30,
            sequence_parallel=cfg.ulysses_sequence_parallel_size,
            seed=self.config.trainer.seed,
        )
        self.engine = self.build_engine(engine_cls, values, strategy)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_rm_score(self, data: DataProto) -> DataProto:
        """``rm_scores`` [B, response_length]: the sequence score on each response's last valid token."""
        extended = _append_one_token(data)
        with self.engine.eval_mode():
            values = self.engine.forward_only(extended)["values"]
        mask = data.batch["response_mask"]
        lengths = mask.sum(-1).long()
        scores = values[torch.arange(len(data)), lengths]  # the appended token's slot: after the last real one
        out = torch.zeros_like(mask, dtype=torch.float32)
        out[torch.arange(len(data)), (lengths - 1).clamp(min=0)] = scores.float()
        return DataProto.from_dict({"rm_scores": out})


def _append_one_token(data: DataProto) -> DataProto:
    """Each row with one more response slot holding a (masked-in) copy of its last token."""
    t = data.batch
    responses, mask = t["responses"], t["response_mask"]
    batch = len(data)
    lengths = mask.sum(-1).long()
    extra = torch.zeros(batch, 1, dtype=responses.dtype)
    responses = torch.cat([responses, extra], dim=1)
    resp_mask = torch.cat([mask, torch.zeros(batch, 1, dtype=mask.dtype)], dim=1)
    resp_mask[torch.arange(batch), lengths] = 1
    last = responses[torch.arange(batch), (lengths - 1).clamp(min=0)]
    responses[torch.arange(batch), lengths] = last
    prompt_len = t["input_ids"].shape[1] - t["responses"].shape[1]
    attention = torch.cat([t["attention_mask"][:, :prompt_len], resp_mask], dim=1)
    input_ids = torch.cat([t["input_ids"][:, :prompt_len], responses], dim=1)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    return DataProto.from_dict(
        {
            "input_ids": input_ids,
            "attention_mask": attention,
            "position_ids": positions,
            "responses": responses,
            "response_mask": resp_mask,
        }
    )
