"""Small Ray tasks that move pending results between calls without a round trip through the driver.

They ask for no CPU (``num_cpus=0``): the groups' placement groups may hold every CPU of the cluster,
and these tasks only reshuffle data that is already in the object store.
"""

from __future__ import annotations

from typing import Any

import ray

from verl.core.controller.dp_shards import split_for_dp


def resolve_state(state: Any) -> Any:
    """A dispatch state with its ObjectRefs fetched (the state itself, or the items of a list/tuple)."""
    if isinstance(state, ray.ObjectRef):
        return ray.get(state)
    if isinstance(state, (list, tuple)):
        refs = [i for i, item in enumerate(state) if isinstance(item, ray.ObjectRef)]
        if refs:
            fetched = ray.get([state[i] for i in refs])
            state = list(state)
            for i, value in zip(refs, fetched):
                state[i] = value
    return state


def refs_of(task: Any, count: int, *args: Any) -> list[ray.ObjectRef]:
    """``task.options(num_returns=count).remote(*args)`` as a list of ``count`` refs. Ray returns a bare
    ObjectRef when ``count == 1`` and a list otherwise, and its stubs type both as one ObjectRef."""
    refs: Any = task.options(num_returns=count).remote(*args)
    return [refs] if count == 1 else list(refs)


@ray.remote(num_cpus=0)
def materialize(mode: Any, layout: Any, state: Any, *outputs: Any) -> Any:
    """Run a dispatch mode's collect where the outputs are, and keep the result in the object store."""
    return mode.collect_fn(layout, resolve_state(state), list(outputs))


@ray.remote(num_cpus=0)
def split_dataproto(value: Any, dp_size: int, what: str) -> tuple:
    """``dp_size`` padded shards of a DataProto, followed by their ShardLayout (``num_returns=dp_size+1``)."""
    shards, layout = split_for_dp(value, dp_size, what)
    return (*shards, layout)


@ray.remote(num_cpus=0)
def split_sequence(value: Any, n: int, what: str) -> Any:
    """The ``n`` items of a list (``num_returns=n``), one per rank."""
    if not isinstance(value, (list, tuple)) or len(value) != n:
        got = f"{len(value)} items" if isinstance(value, (list, tuple)) else type(value).__name__
        raise ValueError(f"{what}: expected a list with one item per rank ({n}), got {got}")
    return value[0] if n == 1 else tuple(value)
