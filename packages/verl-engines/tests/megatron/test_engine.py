"""MegatronEngine (forward-only and weights) against the FSDP2 engine on the same tiny model and batch:
TP2 x PP2 log-probs and entropy of a padded rollout batch match FSDP's (fixed-size and token-budget
micro-batches), and ``named_full_parameters``
gathers exactly the HF weights back (padding stripped, tied head not repeated)."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import make_batch, run_ranks
from megatron_helpers import VOCAB, hf_state, write_model
from megatron_programs import fsdp_engine_outputs, megatron_engine_outputs

from verl.core.protocol import DataProto
from verl.engines.megatron.config import MegatronConfig, MegatronEngineConfig

pytestmark = pytest.mark.megatron


@pytest.mark.parametrize("arch", ["qwen2"])
def test_tp2_pp2_forward_only_and_weights_match_fsdp(arch, tmp_path):
    model_dir = write_model(str(tmp_path / arch), arch, seed=4)
    batch = DataProto.from_dict(make_batch(6, 7, 6, seed=5, vocab=VOCAB), meta_info={"temperature": 0.9})
    fsdp = run_ranks(fsdp_engine_outputs, 1, model_dir, batch, result_dir=str(tmp_path / "fsdp"))[0]
    ranks = run_ranks(
        megatron_engine_outputs,
        4,
        model_dir,
        {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2},
        batch,
        result_dir=str(tmp_path / "megatron"),
    )
    expected = hf_state(model_dir)
    for rank in ranks:
        assert rank["dp"] == (0, 1)
        for key in ("log_probs", "entropy"):
            assert rank["outputs"][key].shape == rank["dynamic"][key].shape == (6, 6)
            torch.testing.assert_close(rank["outputs"][key], fsdp[key], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(rank["dynamic"][key], fsdp[key], atol=1e-5, rtol=1e-5)
        assert sorted(rank["weights"]) == sorted(expected)
        for name, tensor in expected.items():
            assert torch.equal(rank["weights"][name], tensor), name


def test_config_rejects_what_the_engine_cannot_do():
    with pytest.raises(ValueError, match="params_dtype"):
        MegatronConfig(params_dtype="fp8")
    with pytest.raises(NotImplementedError, match="context_parallel_size"):
        MegatronConfig(context_parallel_size=2)
    with pytest.raises(ValueError, match="sequence_parallel"):
        MegatronConfig(sequence_parallel=True)
    with pytest.raises(ValueError, match="virtual_pipeline_model_parallel_size"):
        MegatronConfig(virtual_pipeline_model_parallel_size=2)
    with pytest.raises(ValueError, match="virtual pipeline"):
        MegatronEngineConfig(
            use_dynamic_bsz=True,
            megatron={"pipeline_model_parallel_size": 2, "virtual_pipeline_model_parallel_size": 2},
        )
    config = MegatronEngineConfig(megatron={"tensor_model_parallel_size": 2}, optim={"lr": 1e-5})
    assert config.megatron.tensor_model_parallel_size == 2 and config.optim.lr == 1e-5
