"""The ``batch`` reward manager: one call of a batched reward function for the whole batch."""

from __future__ import annotations

from typing import Any

from verl.algos.rewards.default import default_compute_score_batch
from verl.algos.rewards.manager import FAILED, RewardManager, Sample
from verl.algos.rewards.registry import REWARD_MANAGERS
from verl.algos.rewards.scoring import RewardSetupError, ScoreFn, describe_fn, to_score


@REWARD_MANAGERS.register("batch")
class BatchRewardManager(RewardManager):
    """``compute_score(data_sources, solution_strs, ground_truths, extra_infos)`` returns one float or
    dict per sample (verl's BatchRewardManager contract). Useful when scoring has a fixed cost worth
    amortizing (a remote verifier, a model). If the call raises, each sample is retried alone so that
    only the samples that fail score 0 (and are counted in ``reward/errors``)."""

    score_fn_params = ("data_sources", "solution_strs", "ground_truths", "extra_infos")

    def default_score_fn(self) -> ScoreFn:
        return default_compute_score_batch

    def _call(self, samples: list[Sample]) -> list[Any]:
        out = self.invoke(
            data_sources=[s.data_source for s in samples],
            solution_strs=[s.solution_str for s in samples],
            ground_truths=[s.ground_truth for s in samples],
            extra_infos=[s.extra_info for s in samples],
        )
        if not isinstance(out, (list, tuple)) or len(out) != len(samples):
            raise RewardSetupError(
                f"batched reward function {describe_fn(self.compute_score)} must return a list with one score per "
                f"sample ({len(samples)}), got {type(out).__name__}"
                + (f" of length {len(out)}" if hasattr(out, "__len__") else "")
            )
        return list(out)

    def score(self, samples: list[Sample]) -> list[tuple[float, dict[str, Any]]]:
        if not samples:
            return []
        try:
            raw = self._call(samples)
        except RewardSetupError:
            raise
        except Exception:
            # Each sample alone, so that only those that fail score 0; at once, so that a batch that
            # hung costs about one more timeout, not one per sample.
            singles = [
                {
                    "data_sources": [s.data_source],
                    "solution_strs": [s.solution_str],
                    "ground_truths": [s.ground_truth],
                    "extra_infos": [s.extra_info],
                }
                for s in samples
            ]
            raw = [out if out is FAILED else self._one(out) for out in self.score_each(samples, singles)]
        return [(0.0, {}) if value is FAILED else to_score(value, self.compute_score) for value in raw]

    def _one(self, out: Any) -> Any:
        if not isinstance(out, (list, tuple)) or len(out) != 1:
            raise RewardSetupError(
                f"batched reward function {describe_fn(self.compute_score)} must return a list with one score per "
                f"sample (1), got {type(out).__name__}" + (f" of length {len(out)}" if hasattr(out, "__len__") else "")
            )
        return out[0]
