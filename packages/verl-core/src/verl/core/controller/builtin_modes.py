"""The built-in dispatch modes, registered like any other (see :mod:`verl.core.controller.dispatch`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import ray
import torch

from verl.core.controller.dispatch import Dispatch, Dispatched, GroupLayout, RankCall, register_dispatch_mode
from verl.core.controller.dp_shards import ShardLayout, join_dp_outputs, split_for_dp
from verl.core.controller.futures import GroupFuture
from verl.core.controller.remote_ops import refs_of, split_dataproto, split_sequence
from verl.core.protocol import DataProto


def share(value: Any) -> Any:
    """A value every rank receives: data goes to the object store once instead of once per rank, and a
    pending result is passed as the ObjectRef of its (remotely) collected value."""
    if isinstance(value, GroupFuture):
        return value.as_ref()
    if isinstance(value, (DataProto, torch.Tensor, np.ndarray)):
        return ray.put(value)
    return value


# -- ONE_TO_ALL / RANK_ZERO ---------------------------------------------------------------------------
def dispatch_one_to_all(layout: GroupLayout, args: tuple, kwargs: dict) -> Dispatched:
    args = tuple(share(a) for a in args)
    kwargs = {k: share(v) for k, v in kwargs.items()}
    return Dispatched([RankCall(args, kwargs) for _ in layout.ranks])


def dispatch_rank_zero(layout: GroupLayout, args: tuple, kwargs: dict) -> Dispatched:
    dispatched = dispatch_one_to_all(layout, args, kwargs)
    for i, call in enumerate(dispatched.calls):
        call.return_output = i == 0
    return dispatched


def collect_all(layout: GroupLayout, state: Any, outputs: list) -> list:
    return list(outputs)


def collect_first(layout: GroupLayout, state: Any, outputs: list) -> Any:
    return outputs[0]


# -- ALL_TO_ALL -----------------------------------------------------------------------------------------
def _per_rank(value: Any, n: int, what: str) -> list:
    if isinstance(value, GroupFuture):
        refs = value.per_rank_refs(n)
        if refs is not None:
            return refs
        value = value.as_ref()
    if isinstance(value, ray.ObjectRef):
        return refs_of(split_sequence, n, value, n, what)
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"{what}: has {len(value)} items for {n} ranks; ALL_TO_ALL takes one item per rank")
        return list(value)
    raise TypeError(f"{what}: ALL_TO_ALL takes a list with one item per rank ({n}), got {type(value).__name__}")


def dispatch_all_to_all(layout: GroupLayout, args: tuple, kwargs: dict) -> Dispatched:
    n = len(layout)
    per_arg = [_per_rank(a, n, f"ALL_TO_ALL argument {i}") for i, a in enumerate(args)]
    per_kwarg = {k: _per_rank(v, n, f"ALL_TO_ALL argument {k!r}") for k, v in kwargs.items()}
    calls = [RankCall(tuple(a[i] for a in per_arg), {k: v[i] for k, v in per_kwarg.items()}) for i in range(n)]
    return Dispatched(calls)


# -- DP_COMPUTE_PROTO / DP_COMPUTE_METRIC ---------------------------------------------------------------
def _dp_shards(value: Any, dp_size: int, what: str) -> tuple[list, Any]:
    """(one shard per data-parallel rank, the ShardLayout or an ObjectRef to it)."""
    if isinstance(value, GroupFuture):
        fast = value.dp_shard_refs(dp_size)
        if fast is not None:
            return fast
        value = value.as_ref()
    if isinstance(value, ray.ObjectRef):
        refs = refs_of(split_dataproto, dp_size + 1, value, dp_size, what)
        return refs[:-1], refs[-1]
    shards, shard_layout = split_for_dp(value, dp_size, what)
    return [ray.put(s) for s in shards], shard_layout


def _is_split(value: Any) -> bool:
    return isinstance(value, (DataProto, GroupFuture, ray.ObjectRef))


def dispatch_dp(layout: GroupLayout, args: tuple, kwargs: dict) -> Dispatched:
    """DataProto arguments (and pending results or ObjectRefs of one) are split by data-parallel rank;
    every other argument goes to every rank unchanged."""
    dp = layout.data_parallel()
    layouts: list[Any] = []

    def prepare(value: Any, what: str) -> tuple[bool, Any]:
        if _is_split(value):
            shards, shard_layout = _dp_shards(value, dp.size, what)
            layouts.append(shard_layout)
            return True, shards
        return False, share(value)

    prepared_args = [prepare(a, f"data-parallel argument {i}") for i, a in enumerate(args)]
    prepared_kwargs = {k: prepare(v, f"data-parallel argument {k!r}") for k, v in kwargs.items()}

    def pick(prepared: tuple[bool, Any], dp_rank: int) -> Any:
        split, value = prepared
        return value[dp_rank] if split else value

    calls = []
    for pos in range(len(layout)):
        d = dp.ranks[pos]
        calls.append(
            RankCall(
                tuple(pick(p, d) for p in prepared_args),
                {k: pick(p, d) for k, p in prepared_kwargs.items()},
                return_output=dp.collect[pos],
            )
        )
    return Dispatched(calls, state=layouts)


def _shard_layout(state: list) -> ShardLayout | None:
    layouts = [s for s in state if s is not None]
    if not layouts:
        return None
    if any(s != layouts[0] for s in layouts[1:]):
        raise ValueError(
            "DP_COMPUTE_PROTO: the DataProto arguments of this call were split differently "
            f"({', '.join(map(str, layouts))}); pass them as one DataProto (DataProto.union) or give them the "
            "same number of rows"
        )
    return layouts[0]


def _collected(layout: GroupLayout, outputs: list) -> list:
    return [outputs[layout.collect_position(d)] for d in range(layout.data_parallel().size)]


def collect_dp_proto(layout: GroupLayout, state: list, outputs: list) -> DataProto:
    return join_dp_outputs(_collected(layout, outputs), _shard_layout(state))


def collect_dp_metric(layout: GroupLayout, state: list, outputs: list) -> list:
    return _collected(layout, outputs)


register_dispatch_mode(Dispatch.ONE_TO_ALL, dispatch_one_to_all, collect_all, output_layout="per_rank")
register_dispatch_mode(Dispatch.ALL_TO_ALL, dispatch_all_to_all, collect_all, output_layout="per_rank")
register_dispatch_mode(Dispatch.RANK_ZERO, dispatch_rank_zero, collect_first, output_layout="single")
register_dispatch_mode(
    Dispatch.DP_COMPUTE_PROTO, dispatch_dp, collect_dp_proto, needs_dp_layout=True, output_layout="dp_shards"
)
register_dispatch_mode(Dispatch.DP_COMPUTE_METRIC, dispatch_dp, collect_dp_metric, needs_dp_layout=True)
