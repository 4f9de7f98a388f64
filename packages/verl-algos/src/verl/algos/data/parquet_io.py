"""Writing rows in verl's schema as parquet."""

from __future__ import annotations

import os
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq


def write_parquet(rows: list[dict[str, Any]], path: str | os.PathLike) -> str:
    """Write ``rows`` (dicts with the same keys) to ``path``, creating its directory; returns the path."""
    if not rows:
        raise ValueError(f"refusing to write {path}: no rows")
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path
