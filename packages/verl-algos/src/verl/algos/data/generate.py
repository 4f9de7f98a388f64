"""Generate an offline task as verl-schema parquet files (train.parquet and test.parquet).

    python -m verl.algos.data.generate --task arithmetic --out ~/data/arith
    python -m verl.algos.data.generate --task arithmetic --out DIR --max-value 50 --ops + - --num-terms 3 --train-size 2000
    python -m verl.algos.data.generate --task word_problems --out DIR --num-steps 3 --train-size 2000
    python -m verl.algos.data.generate --task calculator --out DIR --min-value 100 --max-value 999 --ops '*'

All tasks are scored by the numeric reward (the last number of the completion equals the answer);
calculator rows name the tool agent loop (``-r tool_grpo``).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from typing import Any

from verl.algos.data.arithmetic import generate_arithmetic
from verl.algos.data.calculator_task import generate_calculator
from verl.algos.data.parquet_io import run_split_writer, write_parquet
from verl.algos.data.word_problems import generate_word_problems
from verl.core.registry import Registry

#: task name -> function(**options) returning {"train": rows, "test": rows}.
TASK_GENERATORS: Registry[Callable[..., dict[str, list[dict[str, Any]]]]] = Registry("task generator")
TASK_GENERATORS.register("arithmetic")(generate_arithmetic)
TASK_GENERATORS.register("word_problems")(generate_word_problems)
TASK_GENERATORS.register("calculator")(generate_calculator)


def write_task(task: str, out_dir: str, **options: Any) -> dict[str, str]:
    """Generate ``task`` with ``options`` and write ``<out_dir>/train.parquet`` and ``test.parquet``."""
    splits = TASK_GENERATORS.get(task)(**options)
    return {split: write_parquet(rows, os.path.join(out_dir, f"{split}.parquet")) for split, rows in splits.items()}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", required=True, choices=sorted(TASK_GENERATORS.names()))
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train-size", type=int, default=None, help="training problems (default: the task's)")
    parser.add_argument("--val-size", type=int, default=128, help="validation problems (test.parquet)")
    parser.add_argument("--max-value", type=int, default=None, help="largest operand (default: the task's)")
    arith = parser.add_argument_group("arithmetic and calculator")
    arith.add_argument("--min-value", type=int, default=None)
    arith.add_argument("--ops", nargs="+", default=None, help="operations among + - *")
    arith.add_argument("--num-terms", type=int, default=None)
    words = parser.add_argument_group("word_problems")
    words.add_argument("--num-steps", type=int, default=None)
    args = parser.parse_args(argv)
    given = {
        "train_size": args.train_size,
        "max_value": args.max_value,
        "min_value": args.min_value,
        "operations": tuple(args.ops) if args.ops else None,
        "num_terms": args.num_terms,
        "num_steps": args.num_steps,
    }
    task_options = {"word_problems": ("train_size", "max_value", "num_steps")}.get(
        args.task, ("train_size", "max_value", "min_value", "operations", "num_terms")
    )
    options: dict[str, Any] = {"seed": args.seed, "val_size": args.val_size}
    options.update({k: v for k, v in given.items() if k in task_options and v is not None})
    return run_split_writer(parser, lambda: write_task(args.task, args.out, **options), ValueError)


if __name__ == "__main__":
    raise SystemExit(main())
