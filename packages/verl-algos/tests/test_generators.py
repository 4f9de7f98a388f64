"""Offline task generators: determinism, disjoint splits, correct answers, the parquet files they
write (readable by the dataset), and the command line."""

from __future__ import annotations

import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from verl.algos.agent.tool_parsers import get_tool_parser
from verl.algos.agent.tools import load_tools
from verl.algos.data import RLHFDataset
from verl.algos.data.arithmetic import generate_arithmetic
from verl.algos.data.calculator_task import INSTRUCTIONS, generate_calculator
from verl.algos.data.generate import main as generate_main
from verl.algos.data.word_problems import generate_word_problems
from verl.algos.rewards import default_compute_score


def keys(rows):
    return {r["extra_info"]["key"] for r in rows}


def questions(rows):
    return [r["prompt"][0]["content"] for r in rows]


def test_default_arithmetic_is_the_measured_task():
    splits = generate_arithmetic()
    train, test = splits["train"], splits["test"]
    assert (len(train), len(test)) == (313, 128), "441 problems a+b with a, b in 0..20"
    assert not keys(train) & keys(test)
    first = train[0]
    assert first["prompt"] == [{"role": "user", "content": first["extra_info"]["question"]}], "plain user message"
    for r in train + test:
        q = r["prompt"][0]["content"]
        a, b = q.removeprefix("What is ").removesuffix("? Answer with a number.").split("+")
        assert 0 <= int(a) <= 20 and 0 <= int(b) <= 20
        assert r["reward_model"]["ground_truth"] == str(int(a) + int(b))


def test_commutative_twins_land_in_the_same_split():
    splits = generate_arithmetic(seed=3)
    train_q, test_q = set(questions(splits["train"])), set(questions(splits["test"]))
    for q in test_q:
        a, b = q.removeprefix("What is ").removesuffix("? Answer with a number.").split("+")
        assert f"What is {b}+{a}? Answer with a number." not in train_q


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"operations": ("+", "-", "*"), "num_terms": 3, "max_value": 9, "val_size": 50, "train_size": 300},
        {"max_value": 5000, "train_size": 400, "val_size": 100},  # a space too big to enumerate: sampled
    ],
)
def test_arithmetic_is_deterministic_disjoint_and_correct(options):
    a, b = generate_arithmetic(seed=7, **options), generate_arithmetic(seed=7, **options)
    assert a == b
    assert generate_arithmetic(seed=8, **options) != a
    assert not keys(a["train"]) & keys(a["test"])
    assert not set(questions(a["train"])) & set(questions(a["test"]))
    for r in a["train"][:50] + a["test"][:50]:
        expression = r["prompt"][0]["content"].removeprefix("What is ").removesuffix("? Answer with a number.")
        assert int(r["reward_model"]["ground_truth"]) == eval(expression)  # noqa: S307 (our own digits and + - *)


def test_word_problems_are_deterministic_disjoint_and_scored_by_their_answer():
    a = generate_word_problems(seed=1, num_steps=3, train_size=200, val_size=50)
    assert a == generate_word_problems(seed=1, num_steps=3, train_size=200, val_size=50)
    assert len(a["train"]) == 200 and len(a["test"]) == 50
    assert not keys(a["train"]) & keys(a["test"])
    for r in a["train"]:
        truth = r["reward_model"]["ground_truth"]
        assert int(truth) >= 0
        assert default_compute_score(r["data_source"], f"So the answer is {truth}.", truth) == 1.0


def test_calculator_task_rows_run_the_tool_agent_and_their_solution_is_a_call_the_calculator_answers():
    a = generate_calculator(seed=3, train_size=100, val_size=20)
    assert a == generate_calculator(seed=3, train_size=100, val_size=20)
    assert (len(a["train"]), len(a["test"])) == (100, 20)
    assert not keys(a["train"]) & keys(a["test"])
    [calc] = load_tools("builtin:calculator").values()  # the recipe's tool config
    parser = get_tool_parser("hermes")
    for r in a["train"][:30] + a["test"]:
        assert r["agent_name"] == "tool_agent" and r["data_source"] == "calculator"
        assert r["prompt"][0]["content"].startswith(INSTRUCTIONS)
        [call] = parser.parse(r["extra_info"]["solution"]).calls  # the warm-start demonstration
        truth = r["reward_model"]["ground_truth"]
        assert call.name == calc.name and calc.execute("t", call.arguments).text == truth
        assert 10_000 <= int(truth) <= 999 * 999  # 3-digit products
        assert default_compute_score(r["data_source"], f"calc\n{truth}\nSo it is {truth}.", truth) == 1.0
    with pytest.raises(ValueError, match="unknown built-in tool config 'abacus'; built-in: calculator"):
        load_tools("builtin:abacus")


def test_difficulty_and_size_errors():
    with pytest.raises(ValueError, match="operations"):
        generate_arithmetic(operations=("/",))
    with pytest.raises(ValueError, match="train-size"):
        generate_arithmetic(max_value=3, train_size=100)
    with pytest.raises(ValueError, match="distinct problems"):
        generate_word_problems(num_steps=1, max_value=2, train_size=500, val_size=10)


def test_cli_writes_parquet_the_dataset_reads(tmp_path, tokenizer):
    out = tmp_path / "arith"
    assert generate_main(["--task", "arithmetic", "--out", str(out), "--val-size", "20"]) == 0
    train = pq.read_table(out / "train.parquet").to_pylist()
    test = pq.read_table(out / "test.parquet").to_pylist()
    assert (len(train), len(test)) == (421, 20)
    assert train == generate_arithmetic(val_size=20)["train"]
    ds = RLHFDataset(str(out / "test.parquet"), tokenizer, max_prompt_length=64)
    assert len(ds) == 20 and ds.num_filtered == 0


def test_cli_uses_each_tasks_own_defaults(tmp_path):
    out = tmp_path / "calc"
    assert generate_main(["--task", "calculator", "--out", str(out), "--train-size", "40", "--val-size", "8"]) == 0
    assert pq.read_table(out / "train.parquet").to_pylist() == generate_calculator(train_size=40, val_size=8)["train"]


def test_cli_as_a_module(tmp_path):
    out = tmp_path / "words"
    proc = subprocess.run(
        [sys.executable, "-m", "verl.algos.data.generate", "--task", "word_problems", "--out", str(out),
         "--train-size", "30", "--val-size", "10", "--num-steps", "2"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert pq.read_table(out / "train.parquet").num_rows == 30


def test_cli_reports_bad_options(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        generate_main(["--task", "arithmetic", "--out", str(tmp_path), "--ops", "/"])
    assert exit_info.value.code == 2 and "operations" in capsys.readouterr().err
