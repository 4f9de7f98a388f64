"""The ``dapo`` reward manager: per-sample scoring plus DAPO's overlong reward shaping."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from verl.algos.rewards.config import OverlongBufferConfig
from verl.algos.rewards.manager import NaiveRewardManager, RewardResult, Sample
from verl.algos.rewards.registry import REWARD_MANAGERS
from verl.core.config import as_node


@REWARD_MANAGERS.register("dapo")
class DAPORewardManager(NaiveRewardManager):
    """DAPO (Yu et al. 2025, arXiv:2503.14476), "soft overlong punishment".

    With ``overlong_buffer.enable``, responses that run into the last ``len`` tokens before
    ``max_resp_len`` lose reward linearly::

        expected = max_resp_len - len ;  exceed = response_length - expected
        reward  += min(-exceed / len * penalty_factor, 0)

    ``overlong_buffer`` is the ``reward_model.overlong_buffer`` config (``enable``, ``len``,
    ``penalty_factor``); ``max_resp_len`` is ``data.max_response_length``. Extra info gets
    ``overlong_reward`` and ``overlong`` per sample; metric ``reward/overlong_ratio``.
    """

    def __init__(
        self,
        tokenizer: Any,
        *args: Any,
        max_resp_len: int | None = None,
        overlong_buffer: OverlongBufferConfig | Mapping[str, Any] | None = None,
        **kwargs: Any,
    ):
        """``args``/``kwargs``: the naive manager's (compute_score, num_examine, reward_fn_key, timeout_s)."""
        super().__init__(tokenizer, *args, **kwargs)
        buffer = as_node(OverlongBufferConfig, overlong_buffer, "reward_model.overlong_buffer")
        self.overlong_enabled = buffer.enable
        self.buffer_len = buffer.len
        self.penalty_factor = buffer.penalty_factor
        self.max_resp_len = max_resp_len
        if self.overlong_enabled:
            if max_resp_len is None:
                raise ValueError(
                    "reward_model.overlong_buffer.enable=true needs max_resp_len (data.max_response_length)"
                )
            if not 0 < self.buffer_len <= max_resp_len:
                raise ValueError(
                    f"reward_model.overlong_buffer.len={self.buffer_len} must be in (0, max_resp_len={max_resp_len}]"
                )

    @classmethod
    def kwargs_from_config(cls, config: Any) -> dict[str, Any]:
        """The response limit and the overlong buffer, from ``data`` and ``reward_model``."""
        return {"max_resp_len": config.data.max_response_length, "overlong_buffer": config.reward_model.overlong_buffer}

    def overlong_reward(self, response_length: int) -> float:
        expected = self.max_resp_len - self.buffer_len
        exceed = response_length - expected
        return min(-exceed / self.buffer_len * self.penalty_factor, 0.0)

    def shape(self, sample: Sample, output: tuple[float, dict[str, Any]]) -> tuple[float, dict[str, Any]]:
        reward, extra = super().shape(sample, output)
        if self.overlong_enabled:
            penalty = self.overlong_reward(sample.response_length)
            reward += penalty
            extra["overlong_reward"] = penalty
            extra["overlong"] = penalty < 0
        return reward, extra

    def build_result(self, data, samples, rewards, extras) -> RewardResult:
        result = super().build_result(data, samples, rewards, extras)
        if self.overlong_enabled and samples:
            result.metrics["reward/overlong_ratio"] = sum(bool(e["overlong"]) for e in extras) / len(samples)
        return result
