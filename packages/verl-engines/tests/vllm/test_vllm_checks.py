"""What a user is told at start when vLLM or the settings do not fit, before any engine is built."""

import json
import logging
from pathlib import Path

import pytest
from vllm_test_helpers import vllm_config

from verl.engines.rollout.vllm import compat

pytestmark = pytest.mark.vllm


def build(config):
    from verl.engines.rollout.vllm import VLLMRolloutEngine

    return VLLMRolloutEngine(config)


def test_version_range(caplog):
    with pytest.raises(ImportError, match=r"older than the oldest version .* \(0\.16\.0\).*rollout.name=hf"):
        compat.check_version("0.15.1")
    compat.check_version("0.16.0")
    compat.check_version("0.32.1.dev4+gabcdef")
    with caplog.at_level(logging.WARNING, logger=compat.__name__):
        compat.check_version("0.40.0rc1")
    assert "newer than the newest series tested" in caplog.text
    with pytest.raises(ValueError, match="cannot read the vLLM version"):
        compat.check_version("nightly")


def test_the_installed_vllm_is_supported():
    vllm = compat.import_vllm()
    assert compat.version_tuple(vllm.__version__) >= compat.MIN_VERSION


def test_misspelled_engine_kwargs_are_named_with_the_nearest_argument(qwen2_model):
    config = vllm_config(qwen2_model, engine_kwargs={"max_num_seq": 8})
    with pytest.raises(ValueError, match=r"'max_num_seq' \(did you mean max_num_seqs"):
        build(config)


def test_an_architecture_vllm_does_not_implement_is_refused(qwen2_model, tmp_path):
    folder = tmp_path / "odd-model"
    folder.mkdir()
    config = json.loads((Path(qwen2_model) / "config.json").read_text())
    config["architectures"] = ["NoSuchModelForCausalLM"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"no implementation of NoSuchModelForCausalLM.*rollout.name=hf"):
        build(vllm_config(str(folder)))


def test_settings_that_cannot_work_are_refused(qwen2_model):
    with pytest.raises(ValueError, match="tensor_model_parallel_size=2"):
        vllm_config(qwen2_model, tensor_model_parallel_size=2)
    with pytest.raises(ValueError, match="load_format='npz'"):
        vllm_config(qwen2_model, load_format="npz")
    with pytest.raises(ValueError, match="does not work on CPU"):
        build(vllm_config(qwen2_model, weight_sync="load_weights"))


def test_engine_kwargs_split_into_fields_and_vllm_arguments(qwen2_model):
    config = vllm_config(
        qwen2_model, engine_kwargs={"vllm": {"dtype": "bfloat16", "max_num_seqs": 8}, "sglang": {"x": 1}}
    )
    assert config.dtype == "bfloat16" and config.max_num_seqs == 8  # keys named like a field set it
    assert config.passthrough_kwargs() == {"kv_cache_memory_bytes": config.engine_kwargs["kv_cache_memory_bytes"]}
    top = vllm_config(qwen2_model, engine_kwargs={"max_num_seqs": 4, "block_size": 32})
    assert top.max_num_seqs == 4 and top.passthrough_kwargs()["block_size"] == 32
    assert vllm_config(qwen2_model, prompt_length=100, response_length=28).resolved_max_model_len() == 128
