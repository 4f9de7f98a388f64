"""Counting reward-function failures and timeouts, and logging the first one."""

from __future__ import annotations

import logging
from typing import Any

from verl.algos.rewards.scoring import describe_fn

logger = logging.getLogger(__name__)


class RewardTimeout(TimeoutError):
    """A reward-function call ran past ``timeout_s``."""


class FailureLog:
    """Counts reward-function failures (timeouts among them); logs the first traceback of the
    manager's lifetime."""

    def __init__(self) -> None:
        self.logged_first = False
        self.count = 0
        self.timeouts = 0

    def record(self, fn: Any, sample: Any, row: int, error: BaseException) -> None:
        self.count += 1
        self.timeouts += isinstance(error, RewardTimeout)
        if not self.logged_first:
            self.logged_first = True
            logger.error(
                "reward function %s raised on row %d (data_source=%r); the sample scores 0 and the run continues "
                "(further failures are only counted in reward/errors)",
                describe_fn(fn),
                row,
                sample.data_source,
                exc_info=error,
            )
