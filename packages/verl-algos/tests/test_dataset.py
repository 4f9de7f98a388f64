"""The RL prompt dataset: verl's schema from parquet and jsonl, the chat template, left padding,
collation into a DataProto, over-long prompts (filtered and counted, truncated, or an error), and
errors that name the file and the column."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from verl.algos.data import DatasetSchemaError, RLHFDataset, collate_fn


def row(question: str, truth: str = "19", index: int = 0) -> dict:
    return {
        "data_source": "arithmetic",
        "prompt": [{"role": "user", "content": question}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": truth},
        "extra_info": {"split": "train", "index": index},
    }


ROWS = [row("What is 12+7? Answer with a number.", "19", 0), row("What is 3+4? Answer with a number.", "7", 1)]
LONG = row("Tom has 5 apples. " * 20 + "How many apples does Tom have now?", "5", 2)


def write_parquet(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture(params=["parquet", "jsonl"])
def data_file(request, tmp_path):
    writer = write_parquet if request.param == "parquet" else write_jsonl
    return writer(tmp_path / f"train.{request.param}", ROWS)


def test_items_are_left_padded_chat_prompts(data_file, tokenizer):
    ds = RLHFDataset(data_file, tokenizer, max_prompt_length=40, return_raw_chat=True)
    assert len(ds) == 2 and ds.num_filtered == 0
    item = ds[0]
    expected_text = tokenizer.apply_chat_template(ROWS[0]["prompt"], add_generation_prompt=True, tokenize=False)
    expected_ids = tokenizer(expected_text, add_special_tokens=False)["input_ids"]
    n = len(expected_ids)
    assert item["input_ids"].shape == (40,) and item["input_ids"].dtype == torch.long
    assert item["input_ids"][-n:].tolist() == expected_ids
    assert item["input_ids"][: 40 - n].eq(tokenizer.pad_token_id).all()
    assert item["attention_mask"].tolist() == [0] * (40 - n) + [1] * n
    assert item["position_ids"].tolist() == [0] * (40 - n) + list(range(n))
    assert tokenizer.decode(item["raw_prompt_ids"]).endswith("<|im_start|>assistant\n")
    assert item["reward_model"]["ground_truth"] == "19" and item["data_source"] == "arithmetic"
    assert item["index"] == 0 and item["raw_prompt"] == ROWS[0]["prompt"]


def test_collate_builds_a_dataproto(data_file, tokenizer):
    ds = RLHFDataset(data_file, tokenizer, max_prompt_length=40)
    batch = collate_fn([ds[0], ds[1]])
    assert len(batch) == 2
    assert batch.batch["input_ids"].shape == (2, 40)
    assert [rm["ground_truth"] for rm in batch.non_tensor_batch["reward_model"]] == ["19", "7"]
    assert batch.non_tensor_batch["raw_prompt_ids"].shape == (2,)  # one list per row, not a 2-D array


def test_several_files_and_max_samples(tmp_path, tokenizer):
    files = [write_parquet(tmp_path / "a.parquet", ROWS), write_jsonl(tmp_path / "b.jsonl", ROWS[:1])]
    assert len(RLHFDataset(files, tokenizer, max_prompt_length=40)) == 3
    assert len(RLHFDataset(files, tokenizer, max_prompt_length=40, max_samples=2)) == 2


def test_over_long_prompts_are_filtered_and_counted(tmp_path, tokenizer, caplog):
    path = write_parquet(tmp_path / "t.parquet", [*ROWS, LONG])
    ds = RLHFDataset(path, tokenizer, max_prompt_length=40, filter_overlong_prompts=True)
    assert len(ds) == 2 and ds.num_filtered == 1
    assert "filtered 1 of 3" in caplog.text


def test_over_long_prompts_are_an_error_naming_file_and_row(tmp_path, tokenizer):
    path = write_parquet(tmp_path / "t.parquet", [*ROWS, LONG])
    with pytest.raises(DatasetSchemaError, match="row 2") as err:
        RLHFDataset(path, tokenizer, max_prompt_length=40, filter_overlong_prompts=False, truncation="error")
    assert path in str(err.value) and "filter_overlong_prompts" in str(err.value)


@pytest.mark.parametrize("mode", ["left", "right", "middle"])
def test_truncation_modes(tmp_path, tokenizer, mode):
    path = write_parquet(tmp_path / "t.parquet", [LONG])
    ds = RLHFDataset(path, tokenizer, max_prompt_length=40, filter_overlong_prompts=False, truncation=mode)
    text = tokenizer.apply_chat_template(LONG["prompt"], add_generation_prompt=True, tokenize=False)
    full = tokenizer(text, add_special_tokens=False)["input_ids"]
    ids = ds[0]["input_ids"].tolist()
    assert len(full) > 40 and ds[0]["attention_mask"].all()
    expected = {"left": full[-40:], "right": full[:40], "middle": full[:20] + full[-20:]}[mode]
    assert ids == expected


def test_a_tokenizer_without_chat_template_is_an_error_or_a_plain_prompt(data_file, tokenizer_without_template):
    with pytest.raises(ValueError, match="no chat template"):
        RLHFDataset(data_file, tokenizer_without_template, max_prompt_length=40)
    ds = RLHFDataset(data_file, tokenizer_without_template, max_prompt_length=40, plain_prompt_fallback=True)
    assert tokenizer_without_template.decode(ds[0]["raw_prompt_ids"]) == ROWS[0]["prompt"][0]["content"]


def test_missing_column_names_file_and_column(tmp_path, tokenizer):
    rows = [{k: v for k, v in r.items() if k != "reward_model"} for r in ROWS]
    path = write_parquet(tmp_path / "no_reward.parquet", rows)
    with pytest.raises(DatasetSchemaError, match="reward_model") as err:
        RLHFDataset(path, tokenizer)
    assert "no_reward.parquet" in str(err.value)


def test_wrong_prompt_type_names_file_and_column(tmp_path, tokenizer):
    rows = [{**r, "prompt": r["prompt"][0]["content"]} for r in ROWS]  # a plain string, not messages
    path = write_jsonl(tmp_path / "strings.jsonl", rows)
    with pytest.raises(DatasetSchemaError, match="column 'prompt' has type string") as err:
        RLHFDataset(path, tokenizer)
    assert "strings.jsonl" in str(err.value)


def test_reward_model_without_ground_truth(tmp_path, tokenizer):
    rows = [{**r, "reward_model": {"style": "rule"}} for r in ROWS]
    path = write_parquet(tmp_path / "r.parquet", rows)
    with pytest.raises(DatasetSchemaError, match="'reward_model'.*ground_truth"):
        RLHFDataset(path, tokenizer)


def test_bad_value_in_one_row_names_the_row(tmp_path, tokenizer):
    rows = [ROWS[0], {**ROWS[1], "prompt": []}]
    path = write_jsonl(tmp_path / "r.jsonl", rows)
    with pytest.raises(DatasetSchemaError, match="row 1: column 'prompt' is empty"):
        RLHFDataset(path, tokenizer)


def test_empty_files_are_errors(tmp_path, tokenizer):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(DatasetSchemaError, match="empty.jsonl: the file is empty"):
        RLHFDataset(str(empty), tokenizer)
    schema_only = tmp_path / "no_rows.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS).slice(0, 0), schema_only)
    with pytest.raises(DatasetSchemaError, match="no_rows.parquet"):
        RLHFDataset(str(schema_only), tokenizer)


def test_missing_file_and_unsupported_type(tmp_path, tokenizer):
    with pytest.raises(DatasetSchemaError, match="no such data file"):
        RLHFDataset(str(tmp_path / "absent.parquet"), tokenizer)
    with pytest.raises(DatasetSchemaError, match="unsupported file type"):
        RLHFDataset(str(tmp_path / "data.csv"), tokenizer)


def test_bad_options(data_file, tokenizer):
    with pytest.raises(ValueError, match="truncation"):
        RLHFDataset(data_file, tokenizer, truncation="both")
