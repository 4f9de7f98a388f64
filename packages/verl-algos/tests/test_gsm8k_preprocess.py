"""GSM8K preprocessing on small official-format files written in the test."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from verl.algos.data import RLHFDataset
from verl.algos.data.gsm8k_preprocess import INSTRUCTION, GSM8KFormatError, main, preprocess_gsm8k
from verl.algos.rewards import default_compute_score

TRAIN = [
    {
        "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
        "How many clips did Natalia sell altogether in April and May?",
        "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips "
        "altogether in April and May.\n#### 72",
    },
    {"question": "A shop sells 1,200 pens a day. How many in 2 days?", "answer": "1200*2=2400\n#### 2,400"},
]
TEST = [{"question": "What is 6 times 7?", "answer": "6*7=42\n#### 42"}]


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_directory_with_official_files(tmp_path, tokenizer):
    src = tmp_path / "grade-school-math"
    src.mkdir()
    write_jsonl(src / "train.jsonl", TRAIN)
    write_jsonl(src / "test.jsonl", TEST)
    written = preprocess_gsm8k(str(src), str(tmp_path / "out"))
    assert set(written) == {"train", "test"}
    rows = pq.read_table(written["train"]).to_pylist()
    assert rows[0]["data_source"] == "openai/gsm8k" and rows[0]["ability"] == "math"
    assert rows[0]["prompt"] == [{"role": "user", "content": TRAIN[0]["question"] + " " + INSTRUCTION}]
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["72", "2400"]
    assert rows[1]["extra_info"] == {
        "split": "train",
        "index": 1,
        "answer": TRAIN[1]["answer"],
        "question": TRAIN[1]["question"],
    }
    # The reference solution itself earns full reward under the gsm8k scorer.
    for r in rows:
        assert (
            default_compute_score(
                r["data_source"], r["extra_info"]["answer"].replace(",", ""), r["reward_model"]["ground_truth"]
            )
            == 1.0
        )
    ds = RLHFDataset(written["test"], tokenizer, max_prompt_length=128)
    assert len(ds) == 1


def test_cli_with_files(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", TRAIN)
    assert main(["--input", str(train), "--output", str(tmp_path / "out")]) == 0
    assert pq.read_table(tmp_path / "out" / "train.parquet").num_rows == 2


@pytest.mark.parametrize(
    "content,match",
    [
        ('{"question": "q", "answer": "no marker"}\n', "line 1: no '#### <number>'"),
        ('{"question": "q"}\n', "line 1: missing string field 'answer'"),
        ("not json\n", "line 1: not valid JSON"),
    ],
)
def test_malformed_files_are_named(tmp_path, content, match):
    path = tmp_path / "train.jsonl"
    path.write_text(content)
    with pytest.raises(GSM8KFormatError, match=match) as err:
        preprocess_gsm8k(str(path), str(tmp_path / "out"))
    assert "train.jsonl" in str(err.value)


def test_unrecognized_inputs(tmp_path):
    other = write_jsonl(tmp_path / "gsm.jsonl", TEST)
    with pytest.raises(GSM8KFormatError, match="cannot tell the split"):
        preprocess_gsm8k(str(other), str(tmp_path / "out"))
    with pytest.raises(GSM8KFormatError, match="no such file"):
        preprocess_gsm8k(str(tmp_path / "missing"), str(tmp_path / "out"))
    with pytest.raises(SystemExit):
        main(["--input", str(tmp_path / "missing"), "--output", str(tmp_path / "out")])
