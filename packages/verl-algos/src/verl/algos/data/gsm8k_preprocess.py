"""Turn the official GSM8K files into verl's RL schema (parquet).

Input: the ``train.jsonl`` / ``test.jsonl`` of github.com/openai/grade-school-math (lines of
``{"question": ..., "answer": "...reasoning...\\n#### 72"}``), or parquet files with the same two
columns (the Hugging Face ``openai/gsm8k`` layout). Nothing is downloaded: give local paths.

    python -m verl.algos.data.gsm8k_preprocess --input ~/grade-school-math/data --output ~/data/gsm8k

writes ``train.parquet`` and ``test.parquet``, rows as verl's gsm8k example writes them: the question
plus an instruction to end with "####", ``data_source="openai/gsm8k"``, ``ability="math"``,
``reward_model={"style": "rule", "ground_truth": "72"}`` and ``extra_info`` with the split, the
index, the original question and answer.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
from collections.abc import Iterator, Sequence

from verl.algos.data.parquet_io import run_split_writer, write_parquet

DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
_ANSWER = re.compile(r"#### (\-?[0-9\.\,]+)")


class GSM8KFormatError(ValueError):
    pass


def extract_ground_truth(answer: str) -> str:
    """The number after "####" in a GSM8K reference answer, commas removed."""
    found = _ANSWER.search(answer)
    if found is None:
        raise GSM8KFormatError(f"no '#### <number>' final answer in {answer[-80:]!r}")
    return found.group(1).replace(",", "")


def _read_records(path: str) -> Iterator[tuple[int, dict]]:
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        yield from enumerate(pq.read_table(path).to_pylist(), start=1)
        return
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield line_no, json.loads(line)
            except json.JSONDecodeError as e:
                raise GSM8KFormatError(f"{path}, line {line_no}: not valid JSON ({e.msg})") from None


def convert_file(path: str, split: str) -> list[dict]:
    """Rows in verl's schema from one GSM8K file."""
    rows = []
    for line_no, record in _read_records(path):
        where = f"{path}, {'row' if path.endswith('.parquet') else 'line'} {line_no}"
        for key in ("question", "answer"):
            if not isinstance(record.get(key), str):
                raise GSM8KFormatError(f"{where}: missing string field {key!r} (got keys {sorted(record)})")
        try:
            truth = extract_ground_truth(record["answer"])
        except GSM8KFormatError as e:
            raise GSM8KFormatError(f"{where}: {e}") from None
        index = len(rows)
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": record["question"] + " " + INSTRUCTION}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": truth},
                "extra_info": {
                    "split": split,
                    "index": index,
                    "answer": record["answer"],
                    "question": record["question"],
                },
            }
        )
    if not rows:
        raise GSM8KFormatError(f"{path}: no records")
    return rows


def _split_of(path: str) -> str:
    name = os.path.basename(path).lower()
    for split in ("train", "test"):
        if name.startswith(split):
            return split
    raise GSM8KFormatError(f"{path}: cannot tell the split from the file name; name it train*.jsonl or test*.jsonl")


def find_inputs(inputs: Sequence[str]) -> dict[str, list[str]]:
    """Input files by split, from directories (their train*/test* .jsonl/.parquet files) and files."""
    by_split: dict[str, list[str]] = {}
    for item in inputs:
        if os.path.isdir(item):
            found = sorted(
                p
                for pattern in ("train*.jsonl", "test*.jsonl", "train*.parquet", "test*.parquet")
                for p in glob.glob(os.path.join(item, pattern))
            )
            if not found:
                raise GSM8KFormatError(f"{item}: no train*.jsonl or test*.jsonl (or .parquet) files in this directory")
        elif os.path.isfile(item):
            found = [item]
        else:
            raise GSM8KFormatError(f"{item}: no such file or directory")
        for path in found:
            by_split.setdefault(_split_of(path), []).append(path)
    return by_split


def preprocess_gsm8k(inputs: str | Sequence[str], output_dir: str) -> dict[str, str]:
    """Convert the GSM8K files in ``inputs`` and write ``<output_dir>/<split>.parquet``; returns
    {split: path}."""
    inputs = [inputs] if isinstance(inputs, str) else list(inputs)
    written = {}
    for split, paths in find_inputs(inputs).items():
        rows = []
        for path in paths:
            for row in convert_file(path, split):
                row["extra_info"]["index"] = len(rows)
                rows.append(row)
        written[split] = write_parquet(rows, os.path.join(output_dir, f"{split}.parquet"))
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", nargs="+", required=True, help="a directory with train.jsonl/test.jsonl, or files")
    parser.add_argument("--output", required=True, help="directory to write train.parquet / test.parquet into")
    args = parser.parse_args(argv)
    return run_split_writer(parser, lambda: preprocess_gsm8k(args.input, args.output), GSM8KFormatError)


if __name__ == "__main__":
    raise SystemExit(main())
