"""Every role worker seeds Python's and numpy's RNGs from trainer.seed, as torch's (real Ray workers)."""

from __future__ import annotations

import random
import sys

import numpy as np
import pytest
import ray

from verl.algos.config import load_config
from verl.algos.workers.critic import CriticWorker
from verl.core.controller import Dispatch, ResourcePool, WorkerGroup, register


class ProbedCritic(CriticWorker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def draw(self) -> tuple[float, float]:
        return random.random(), float(np.random.rand())


@pytest.fixture
def pickled_by_value():
    module = sys.modules[__name__]
    ray.cloudpickle.register_pickle_by_value(module)  # the workers cannot import this test module
    yield
    ray.cloudpickle.unregister_pickle_by_value(module)


def test_workers_draw_from_the_seeded_python_and_numpy_generators(tiny_model_dir, ray_session, pickled_by_value):
    seed = 1234
    cfg = load_config("ppo", [f"actor_rollout_ref.model.path={tiny_model_dir}", f"trainer.seed={seed}"])
    pool = ResourcePool([2])
    group = WorkerGroup(pool, ProbedCritic, cfg)
    try:
        group.init_model()
        draws = group.draw()
    finally:
        group.shutdown()
        pool.shutdown()
    random.seed(seed)
    np.random.seed(seed)
    expected = (random.random(), float(np.random.rand()))
    assert draws == [expected, expected]
