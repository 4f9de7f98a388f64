"""Shared Ray session for the controller tests.

Ray starts once (a few seconds) and is reused by every module that asks for ``ray_local``. The module that
needs its own two-node cluster (``test_multinode.py``) runs last among these tests, so the local session
starts only once, and Ray is shut down when the run leaves this directory (other packages' tests may
start their own). Each module shuts down its own groups and pools so the next one finds every slot free.

Worker classes live in the test modules, which Ray's worker processes cannot import by name (pytest
imports them from a path), so each test module is shipped to the workers by value.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import ray

from verl.core.controller import init_ray

HERE = Path(__file__).resolve().parent
OWN_CLUSTER_MODULE = "test_multinode.py"

#: Logical CPU slots: enough for the largest module (two 4-process groups at once) whatever the machine.
NUM_CPUS = 8


@pytest.fixture(scope="session")
def _ray_shutdown_at_end():
    yield
    if ray.is_initialized():
        ray.shutdown()


@pytest.fixture(scope="module")
def ray_local(_ray_shutdown_at_end):
    if not ray.is_initialized():
        init_ray(num_cpus=NUM_CPUS, logging_level=logging.WARNING)
    yield


@pytest.fixture(scope="module", autouse=True)
def _ship_test_module_by_value(request):
    ray.cloudpickle.register_pickle_by_value(request.module)
    yield
    ray.cloudpickle.unregister_pickle_by_value(request.module)


def _is_here(item: pytest.Item) -> bool:
    return HERE in Path(item.path).resolve().parents


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    positions = [i for i, item in enumerate(items) if _is_here(item)]
    ordered = sorted((items[i] for i in positions), key=lambda item: Path(item.path).name == OWN_CLUSTER_MODULE)
    for i, item in zip(positions, ordered):
        items[i] = item


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    result = yield  # the item's fixtures (groups, pools) are torn down first
    if (nextitem is None or not _is_here(nextitem)) and ray.is_initialized():
        ray.shutdown()
    return result
