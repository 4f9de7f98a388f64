"""Writing rows in verl's schema as parquet."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
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


def run_split_writer(
    parser: argparse.ArgumentParser, write: Callable[[], dict[str, str]], error: type[Exception]
) -> int:
    """The end of a data command: ``write()`` (split -> file written); its ``error`` exits 2 with the
    message, as argparse does for a bad argument; else each split's file is printed."""
    try:
        written = write()
    except error as e:
        parser.exit(2, f"error: {e}\n")
    for split, path in written.items():
        print(f"{split}: {path}")
    return 0
