"""Nothing verl loads from disk can run code: engine checkpoints are read as safetensors and JSON only (a
pickle put in place of a file is refused, naming it), a model's legacy ``pytorch_model.bin`` loads with
``weights_only=True``, and a model folder's own Python code is never imported (``trust_remote_code`` is
off unless asked for)."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from rank_programs import make_engine

from verl.engines.fsdp import FSDPEngineConfig
from verl.engines.models import load_config, load_model


class _Payload:
    """Unpickling this runs code: it creates ``marker``."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').close()",))


def test_the_payload_really_runs_code_when_unpickled(tmp_path):
    """The check that the tests below are not vacuous, for both pickle and torch.load without weights_only."""
    pickle.loads(pickle.dumps(_Payload(tmp_path / "a")))
    torch.save(_Payload(tmp_path / "b"), tmp_path / "b.pt")
    torch.load(tmp_path / "b.pt", weights_only=False)
    assert (tmp_path / "a").exists() and (tmp_path / "b").exists()


@pytest.mark.parametrize("target", ["state/shard-00001-model-00001-of-00001.safetensors", "rng/rank_0.safetensors"])
def test_engine_checkpoint_file_replaced_by_a_pickle_is_refused(tiny_model, tmp_path, one_process_group, target):
    engine = make_engine(tiny_model)
    engine.save_checkpoint(str(tmp_path / "actor"))
    marker = tmp_path / "pwned"
    (tmp_path / "actor" / target).write_bytes(pickle.dumps(_Payload(marker)))
    with pytest.raises(ValueError, match=f"{target} is not a valid safetensors file") as raised:
        engine.load_checkpoint(str(tmp_path / "actor"))
    assert "Load an earlier checkpoint" in str(raised.value)
    assert not marker.exists()


def test_truncated_engine_checkpoint_file_is_refused(tiny_model, tmp_path, one_process_group):
    engine = make_engine(tiny_model)
    engine.save_checkpoint(str(tmp_path / "actor"))
    shard = tmp_path / "actor" / "state" / "shard-00001-model-00001-of-00001.safetensors"
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(ValueError, match="truncated, damaged or was replaced"):
        engine.load_checkpoint(str(tmp_path / "actor"))


def test_a_malicious_pytorch_model_bin_is_not_unpickled(tiny_model, tmp_path):
    folder = Path(shutil.copytree(tiny_model, tmp_path / "model"))
    (folder / "model.safetensors").unlink()
    marker = tmp_path / "pwned"
    torch.save({"model.embed_tokens.weight": _Payload(marker)}, folder / "pytorch_model.bin")
    with pytest.raises(Exception, match="[Ww]eights only load failed"):
        load_model(str(folder))
    assert not marker.exists()


def test_remote_code_is_off_unless_asked_for():
    from verl.engines.rollout.hf import HFRolloutConfig
    from verl.engines.rollout.vllm.config import VLLMRolloutConfig

    for config_class in (FSDPEngineConfig, HFRolloutConfig, VLLMRolloutConfig):
        assert config_class(model_path="m").trust_remote_code is False, config_class.__name__


def test_a_model_folder_code_is_not_imported(tiny_model, tmp_path):
    """``auto_map`` in config.json points transformers at Python files in the folder; without
    trust_remote_code (verl's default everywhere) they are never imported."""
    marker = tmp_path / "pwned"
    folder = Path(shutil.copytree(tiny_model, tmp_path / "model"))
    (folder / "evil.py").write_text(
        f"open({str(marker)!r}, 'w').close()\n"
        "from transformers import Qwen2Config\n"
        "class EvilConfig(Qwen2Config):\n"
        "    model_type = 'evil'\n"
    )
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "evil.EvilConfig"}
    (folder / "config.json").write_text(json.dumps(config))
    load_config(str(folder))  # a known model_type: transformers' own class, the folder's code ignored
    config["model_type"] = "evil"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="trust_remote_code"):
        load_config(str(folder))
    assert not marker.exists()
