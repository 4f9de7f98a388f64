"""How a worker builds an engine's config from the run config: strictly for training engines, and for
rollout engines with a warning that names another engine's settings instead of dropping them silently."""

from __future__ import annotations

import logging

import pytest

from verl.algos.config.schema import RolloutConfig
from verl.algos.workers.engine_config import engine_config, rollout_engine_values
from verl.engines.fsdp.config import FSDPEngineConfig
from verl.engines.rollout.hf.config import HFRolloutConfig


def test_engine_config_refuses_a_key_the_engine_does_not_declare():
    with pytest.raises(ValueError, match="takes no tensor_model_parallel_size"):
        engine_config(FSDPEngineConfig, {"model_path": "m", "tensor_model_parallel_size": 2})
    assert engine_config(FSDPEngineConfig, {"model_path": "m"}).model_path == "m"


def test_rollout_engine_values_names_settings_the_engine_does_not_read(caplog):
    section = RolloutConfig(max_num_seqs=128, gpu_memory_utilization=0.7)
    values = {"model_path": "m", "micro_batch_size": 4, "max_num_seqs": 128, "gpu_memory_utilization": 0.7}
    values["enable_prefix_caching"] = section.enable_prefix_caching  # at its default: not worth a warning
    with caplog.at_level(logging.WARNING):
        config = rollout_engine_values(HFRolloutConfig, values, section, "hf")
    assert isinstance(config, HFRolloutConfig) and config.micro_batch_size == 4
    (record,) = [r for r in caplog.records if "does not read" in r.getMessage()]
    message = record.getMessage()
    assert "actor_rollout_ref.rollout.gpu_memory_utilization=0.7" in message
    assert "actor_rollout_ref.rollout.max_num_seqs=128" in message
    assert "enable_prefix_caching" not in message


def test_rollout_engine_values_is_quiet_when_nothing_is_lost(caplog):
    with caplog.at_level(logging.WARNING):
        rollout_engine_values(HFRolloutConfig, {"model_path": "m", "max_num_seqs": 256}, RolloutConfig(), "hf")
    assert not [r for r in caplog.records if "does not read" in r.getMessage()]
