"""Reward managers: from a batch of generated responses to ``token_level_scores``.

A manager decodes each response with the tokenizer it was given, calls the reward function with
verl's signature ``fn(data_source, solution_str, ground_truth, extra_info=None)``, and places the
score on the response's last valid token (position 0 for an empty response, so the sequence sum
still carries it). It reads from the DataProto:

- ``responses`` [batch, response_length] and ``response_mask`` (or ``attention_mask``);
- ``prompts`` (optional, only to log examples);
- non-tensor ``data_source`` (the key is ``reward_fn_key``), ``reward_model`` (a dict with
  ``ground_truth``) and ``extra_info`` (optional).

Calls: with ``timeout_s`` (default 300 s, as verl's prime manager), up to ``concurrency`` calls run at
once in threads, and a batch whose every call hangs ends in about one timeout (see ``parallel.py``);
with ``timeout_s=None``, one after the other in the caller's thread.

Failures: a reward function that raises for a sample (or runs past ``timeout_s``) scores it 0,
counts it in ``reward/errors`` (and ``reward/timeouts``), and logs the first traceback; the run
goes on. If it fails on every sample of a batch it is broken, and
:class:`~verl.algos.rewards.failures.RewardFunctionError` stops the run (see ``failures.py``). A return
value that is not a finite number (or a dict with a numeric ``score``), and an unknown data_source, are
configuration errors and raise :class:`~verl.algos.rewards.scoring.RewardSetupError`.
"""

from __future__ import annotations

import functools
import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import torch

from verl.algos.data.fields import response_tokens_mask
from verl.algos.data.masked import object_array
from verl.algos.rewards.default import default_compute_score
from verl.algos.rewards.failures import FailureLog
from verl.algos.rewards.parallel import DEFAULT_CONCURRENCY, call_all
from verl.algos.rewards.registry import REWARD_MANAGERS
from verl.algos.rewards.scoring import RewardSetupError, ScoreFn, check_signature, describe_fn, to_score
from verl.core.protocol import DataProto

logger = logging.getLogger(__name__)

#: What :meth:`RewardManager.score_each` gives for a sample whose call failed (it scores 0).
FAILED = object()

#: ``reward_model.timeout_s``'s default: verl's prime reward manager gives each call 300 s.
DEFAULT_TIMEOUT_S = 300.0


@dataclass
class RewardResult:
    """``reward_tensor``: the token_level_scores [batch, response_length]; ``extra_info``: per-sample
    lists aligned with the rows (always ``score``, plus the extra keys of dict rewards, None where a
    sample lacks one); ``metrics``: batch metrics (``reward/errors``, ...)."""

    reward_tensor: torch.Tensor
    extra_info: dict[str, list[Any]] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)

    def apply_to(self, data: DataProto) -> DataProto:
        """Write ``token_level_scores`` into the batch and the extra infos as non-tensor fields."""
        data.batch["token_level_scores"] = self.reward_tensor
        for key, values in self.extra_info.items():
            data.non_tensor_batch[key] = object_array(values)
        return data


@dataclass
class Sample:
    data_source: str
    solution_str: str
    ground_truth: Any
    extra_info: Any
    response_length: int  # valid response tokens
    score_position: int  # where the score goes in the row


class RewardManager(ABC):
    """Base of the reward managers. ``compute_score``: the reward function (default: the built-in
    scorer of each data_source); ``num_examine``: how many decoded examples per data_source to log."""

    #: The keyword arguments the reward function is called with.
    score_fn_params: tuple[str, ...] = ("data_source", "solution_str", "ground_truth", "extra_info")

    @classmethod
    def kwargs_from_config(cls, config: Any) -> dict[str, Any]:
        """Constructor arguments this manager takes from the run config (``config``: the whole run
        config) beyond the tokenizer, the score function and the timeout; a manager with settings of its
        own overrides it, so the trainer never asks which manager it built."""
        return {}

    def __init__(
        self,
        tokenizer: Any,
        compute_score: ScoreFn | None = None,
        num_examine: int = 0,
        reward_fn_key: str = "data_source",
        timeout_s: float | None = DEFAULT_TIMEOUT_S,
        concurrency: int = DEFAULT_CONCURRENCY,
    ):
        if tokenizer is None:
            raise ValueError(f"{type(self).__name__} needs the tokenizer to decode responses")
        self.tokenizer = tokenizer
        self.compute_score = compute_score or self.default_score_fn()
        check_signature(self.compute_score, self.score_fn_params)
        self.num_examine = num_examine
        self.reward_fn_key = reward_fn_key
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"reward_model.timeout_s={timeout_s} must be positive (or None for no limit)")
        self.timeout_s = timeout_s
        if concurrency < 1:
            raise ValueError(f"the reward manager's concurrency={concurrency} must be at least 1")
        self.concurrency = concurrency
        self.failures = FailureLog()

    def default_score_fn(self) -> ScoreFn:
        return default_compute_score

    def __call__(self, data: DataProto) -> RewardResult:
        samples = self.decode(data)
        errors_before, timeouts_before = self.failures.count, self.failures.timeouts
        outputs = self.score(samples)
        failed = self.failures.count - errors_before
        if samples and failed == len(samples):
            raise self.failures.whole_batch_failed(
                self.compute_score, len(samples), self.failures.timeouts - timeouts_before
            )
        rewards, extras = [], []
        for sample, output in zip(samples, outputs):
            reward, extra = self.shape(sample, output)
            rewards.append(reward)
            extras.append(extra)
        result = self.build_result(data, samples, rewards, extras)
        errors = self.failures.count - errors_before
        result.metrics["reward/errors"] = float(errors)
        result.metrics["reward/timeouts"] = float(self.failures.timeouts - timeouts_before)
        if errors:
            logger.warning("reward: %d of %d samples failed to score and were given 0", errors, len(samples))
        self.log_examples(data, samples, rewards)
        return result

    @abstractmethod
    def score(self, samples: list[Sample]) -> list[tuple[float, dict[str, Any]]]:
        """(score, extra metrics) per sample, in order."""

    def shape(self, sample: Sample, output: tuple[float, dict[str, Any]]) -> tuple[float, dict[str, Any]]:
        """Final reward and extra info of a sample from its score (managers may add shaping)."""
        score, extra = output
        return score, {"score": score, **extra}

    # -- helpers ------------------------------------------------------------------------------------
    def invoke(self, **kwargs: Any) -> Any:
        """One call of the reward function, bounded by ``timeout_s`` when set (see :mod:`.parallel`)."""
        if self.timeout_s is None:
            return self.compute_score(**kwargs)
        ((ok, value),) = call_all(
            [functools.partial(self.compute_score, **kwargs)], self.timeout_s, 1, describe_fn(self.compute_score)
        )
        if not ok:
            raise value
        return value

    def invoke_many(self, kwargs_list: list[dict[str, Any]]) -> list[tuple[bool, Any]]:
        """Many calls: ``(True, value)`` or ``(False, exception)`` each. With ``timeout_s``, up to
        ``concurrency`` at once in threads, so a batch of hanging calls ends in about one timeout;
        without, one after the other in this thread."""
        if self.timeout_s is None:
            outcomes = []
            for kwargs in kwargs_list:
                try:
                    outcomes.append((True, self.compute_score(**kwargs)))
                except Exception as e:
                    outcomes.append((False, e))
            return outcomes
        calls = [functools.partial(self.compute_score, **kwargs) for kwargs in kwargs_list]
        return call_all(calls, self.timeout_s, self.concurrency, describe_fn(self.compute_score))

    def score_each(self, samples: list[Sample], kwargs_list: list[dict[str, Any]]) -> list[Any]:
        """The raw return value per sample, ``FAILED`` where the call failed (recorded in the failure log).
        A configuration error (RewardSetupError) or an exit (SystemExit, KeyboardInterrupt) raises."""
        values = []
        for row, (sample, (ok, value)) in enumerate(zip(samples, self.invoke_many(kwargs_list))):
            if ok:
                values.append(value)
                continue
            if isinstance(value, RewardSetupError) or not isinstance(value, Exception):
                raise value
            self.failures.record(self.compute_score, sample, row, value)
            values.append(FAILED)
        return values

    def decode(self, data: DataProto) -> list[Sample]:
        batch = data.batch
        if batch is None or "responses" not in batch.keys():
            raise ValueError(f"the reward manager needs 'responses' in the batch (fields: {data.keys()})")
        responses = batch["responses"]
        mask = response_tokens_mask(data).bool()
        non_tensor = data.non_tensor_batch
        for key in (self.reward_fn_key, "reward_model"):
            if key not in non_tensor:
                raise ValueError(
                    f"the reward manager needs the non-tensor field {key!r} (from the dataset row); "
                    f"the batch has {sorted(non_tensor)}"
                )
        extra_infos = non_tensor.get("extra_info")
        agent_fields = {key: non_tensor[key] for key in AGENT_EXTRA_INFO if key in non_tensor}
        samples = []
        for i in range(len(data)):
            valid = torch.nonzero(mask[i]).flatten()
            last = int(valid[-1]) if len(valid) else -1
            ids = responses[i, : last + 1][mask[i, : last + 1]].tolist()
            reward_model = non_tensor["reward_model"][i]
            if not isinstance(reward_model, dict) or "ground_truth" not in reward_model:
                raise ValueError(f"row {i}: 'reward_model' must be a dict with 'ground_truth', got {reward_model!r}")
            samples.append(
                Sample(
                    data_source=non_tensor[self.reward_fn_key][i],
                    solution_str=self.tokenizer.decode(ids, skip_special_tokens=True),
                    ground_truth=reward_model["ground_truth"],
                    extra_info=_with_agent_fields(None if extra_infos is None else extra_infos[i], agent_fields, i),
                    response_length=len(valid),
                    score_position=max(last, 0),
                )
            )
        return samples

    def build_result(self, data, samples, rewards, extras) -> RewardResult:
        responses = data.batch["responses"]
        tensor = torch.zeros(responses.shape, dtype=torch.float32, device=responses.device)
        for row, (sample, reward) in enumerate(zip(samples, rewards)):
            tensor[row, sample.score_position] = reward
        keys: list[str] = []
        for extra in extras:
            keys.extend(k for k in extra if k not in keys)
        extra_info = {k: [extra.get(k) for extra in extras] for k in keys}
        return RewardResult(tensor, extra_info, {})

    def log_examples(self, data: DataProto, samples: list[Sample], rewards: list[float]) -> None:
        if self.num_examine <= 0:
            return
        shown: dict[str, int] = {}
        for row, (sample, reward) in enumerate(zip(samples, rewards)):
            if shown.get(sample.data_source, 0) >= self.num_examine:
                continue
            shown[sample.data_source] = shown.get(sample.data_source, 0) + 1
            prompt = self._prompt_text(data, row)
            logger.info(
                "[%s] prompt=%r response=%r ground_truth=%r reward=%s",
                sample.data_source,
                prompt,
                sample.solution_str,
                sample.ground_truth,
                reward,
            )

    def _prompt_text(self, data: DataProto, row: int) -> str | None:
        batch = data.batch
        if "prompts" not in batch.keys():
            return None
        prompt = batch["prompts"][row]
        if "attention_mask" in batch.keys():
            prompt = prompt[batch["attention_mask"][row, : prompt.shape[0]].bool()]
        return self.tokenizer.decode(prompt.tolist(), skip_special_tokens=True)


@REWARD_MANAGERS.register("naive")
class NaiveRewardManager(RewardManager):
    """Scores one sample at a time (``reward_model.reward_manager=naive``, verl's default)."""

    def score(self, samples: list[Sample]) -> list[tuple[float, dict[str, Any]]]:
        kwargs_list = [
            {
                "data_source": s.data_source,
                "solution_str": s.solution_str,
                "ground_truth": s.ground_truth,
                "extra_info": s.extra_info,
            }
            for s in samples
        ]
        values = self.score_each(samples, kwargs_list)
        return [(0.0, {}) if value is FAILED else to_score(value, self.compute_score) for value in values]


#: What an agent loop adds to a row that the score function sees in ``extra_info`` (verl's names): the
#: sum of its tools' rewards, the interaction's score of each reply, and the number of turns.
AGENT_EXTRA_INFO = {"tool_reward": "tool_reward", "turn_scores": "turn_scores", "__num_turns__": "num_turns"}


def _with_agent_fields(extra_info: Any, agent_fields: dict[str, Any], row: int) -> Any:
    """``extra_info`` with the agent loop's per-row fields when an agent loop rolled the row out."""
    if not agent_fields:
        return extra_info
    merged = dict(extra_info) if isinstance(extra_info, dict) else {}
    for key, values in agent_fields.items():
        merged[AGENT_EXTRA_INFO[key]] = values[row]
    merged["tool_reward"] = float(merged.get("tool_reward", 0.0))
    return merged
