"""Counting reward-function failures and timeouts, logging the first one, and stopping the run when a
whole batch fails.

The policy, the same for every manager: a reward function that raises for one sample, or runs past
``reward_model.timeout_s``, costs that sample (it scores 0, counted in ``reward/errors`` and
``reward/timeouts``) and the run goes on; a grader that trips on one odd response must not end a long
run. When it fails on *every* sample of a batch it is broken (a bug in the function, a verifier that is
down), and training on all-zero rewards would only waste the run: :class:`RewardFunctionError` stops it,
naming the function, the row's data_source and the error. The last complete checkpoint is untouched, so
fixing the function and starting the same command again resumes from it.
"""

from __future__ import annotations

import logging
from typing import Any

from verl.algos.rewards.scoring import RewardSetupError, describe_fn

logger = logging.getLogger(__name__)


class RewardTimeout(TimeoutError):
    """A reward-function call ran past ``timeout_s``."""


class RewardFunctionError(RewardSetupError):
    """The reward function failed on every sample of a batch: it is broken, and the run stops."""


class FailureLog:
    """Counts reward-function failures (timeouts among them); logs the first traceback of the
    manager's lifetime; keeps the last failure to report if a whole batch fails."""

    def __init__(self) -> None:
        self.logged_first = False
        self.count = 0
        self.timeouts = 0
        self.last: tuple[Any, int, BaseException] | None = None

    def record(self, fn: Any, sample: Any, row: int, error: BaseException) -> None:
        self.count += 1
        self.timeouts += isinstance(error, RewardTimeout)
        self.last = (sample, row, error)
        if not self.logged_first:
            self.logged_first = True
            logger.error(
                "reward function %s raised on row %d (data_source=%r); the sample scores 0 and the run continues "
                "(further failures are only counted in reward/errors; a failure on every sample of a batch stops "
                "the run)",
                describe_fn(fn),
                row,
                sample.data_source,
                exc_info=error,
            )

    def whole_batch_failed(self, fn: Any, batch_size: int, timeouts: int) -> RewardFunctionError:
        """The error that stops the run when all ``batch_size`` samples of a batch failed."""
        sample, row, error = self.last
        if timeouts == batch_size:
            what = f"ran past reward_model.timeout_s on all {batch_size} samples of the batch"
            fix = "raise reward_model.timeout_s, or make the function faster (or check the service it calls)"
        else:
            what = f"raised on all {batch_size} samples of the batch"
            fix = "fix the function"
        stop = RewardFunctionError(
            f"reward function {describe_fn(fn)} {what}, e.g. on row {row} (data_source={sample.data_source!r}): "
            f"{type(error).__name__}: {error}. A reward function that fails on every sample is broken, so the run "
            f"stops; {fix}, then run the same command again: it resumes from the last complete checkpoint, which "
            "is kept. (A failure on some samples only scores them 0 and is counted in reward/errors.)"
        )
        stop.__cause__ = error  # the function's own traceback goes into the log with the stop
        return stop
