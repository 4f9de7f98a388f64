"""Splitting a DataProto by data-parallel rank and joining the results back, padding removed.

A batch of ``n`` rows is padded to a multiple of ``dp_size`` (the padding repeats real rows, see
``DataProto.pad_to_divisor``) and cut into equal shards, so every rank runs the same number of steps. The
padding sits at the end, hence in the last shard(s); :class:`ShardLayout` records how many rows each shard
had and how many of them were padding. Outputs may keep one row per input row or a fixed multiple of it
(``n`` samples per prompt): the trailing rows that came from padding are dropped in the same proportion.
This stays true through a chain of calls, which is why a pending result can be handed from one
data-parallel call to the next shard by shard and trimmed only once, at the end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from verl.core.protocol import DataProto


@dataclass(frozen=True)
class ShardLayout:
    #: Rows each data-parallel shard received, padding included (all equal).
    rows: tuple[int, ...]
    #: How many of those rows were padding (trailing).
    pads: tuple[int, ...]

    @property
    def dp_size(self) -> int:
        return len(self.rows)


def split_for_dp(
    data: DataProto, dp_size: int, what: str = "data-parallel dispatch"
) -> tuple[list[DataProto], ShardLayout]:
    """Pad ``data`` to a multiple of ``dp_size`` and cut it into ``dp_size`` equal shards."""
    if not isinstance(data, DataProto):
        raise TypeError(f"{what}: expected a DataProto to split across data-parallel ranks, got {type(data).__name__}")
    n = len(data)
    if n == 0:
        raise ValueError(
            f"{what}: the DataProto is empty; there is nothing to split across {dp_size} data-parallel ranks"
        )
    padded, pad = data.pad_to_divisor(dp_size)
    shards = padded.chunk(dp_size)
    size = len(shards[0])
    pads = tuple(max(0, (i + 1) * size - max(n, i * size)) for i in range(dp_size))
    assert sum(pads) == pad, (pads, pad)
    return shards, ShardLayout(rows=(size,) * dp_size, pads=pads)


def trim_padding(output: Any, rows: int, pad: int, where: str) -> DataProto:
    """Drop the rows of one shard's output that came from padding rows of its input."""
    if not isinstance(output, DataProto):
        raise TypeError(
            f"{where}: a DP_COMPUTE_PROTO method must return a DataProto, got {type(output).__name__}; "
            "use Dispatch.DP_COMPUTE_METRIC for methods that return metrics or other values"
        )
    if pad == 0:
        return output
    out_rows = len(output)
    if (out_rows * pad) % rows:
        raise ValueError(
            f"{where}: the output has {out_rows} rows for {rows} input rows ({pad} of them padding); padding can "
            "only be removed when a method returns one row per input row, or a fixed number of rows per input row"
        )
    return output[: out_rows - out_rows * pad // rows]


def join_dp_outputs(outputs: list[Any], layout: ShardLayout | None, what: str = "DP_COMPUTE_PROTO") -> DataProto:
    """Concatenate one output per data-parallel rank, in order, with the padding removed."""
    if layout is None:  # nothing was split (no DataProto argument): nothing to trim
        return DataProto.concat(outputs)
    if len(outputs) != layout.dp_size:
        raise ValueError(f"{what}: got {len(outputs)} outputs for {layout.dp_size} data-parallel shards")
    parts = [
        trim_padding(out, rows, pad, f"{what} (data-parallel rank {d})")
        for d, (out, rows, pad) in enumerate(zip(outputs, layout.rows, layout.pads))
    ]
    parts = [p for p in parts if len(p)] or parts[:1]
    return DataProto.concat(parts)
