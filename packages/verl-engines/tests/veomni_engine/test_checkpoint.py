"""Checkpoints of the VeOmni engine resume bit-exact, and its HF export loads in transformers."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import rl_batch, run_ranks
from veomni_programs import save_export_resume

pytestmark = pytest.mark.veomni


def test_save_resume_and_export_on_two_ranks(tiny_model, tmp_path):
    from transformers import AutoModelForCausalLM

    batch_a, batch_b = rl_batch(4, 6, 5, seed=1), rl_batch(4, 6, 5, seed=2)
    ckpt_dir, export_dir = str(tmp_path / "ckpt"), str(tmp_path / "export")
    ranks = run_ranks(
        save_export_resume, 2, tiny_model, batch_a, batch_b, ckpt_dir, export_dir, result_dir=str(tmp_path / "r")
    )
    result = ranks[0]
    for name, value in result["saved"].items():
        assert torch.equal(result["loaded"][name], value), name
        # the step after resuming is the step the first engine took (optimizer state and lr restored)
        assert torch.equal(result["resumed_after"][name], result["after"][name]), name
    assert not torch.equal(result["after"]["lm_head.weight"], result["saved"]["lm_head.weight"])
    exported = AutoModelForCausalLM.from_pretrained(export_dir, dtype=torch.float32)
    state = exported.state_dict()
    for name, value in result["saved"].items():
        assert torch.equal(state[name], value), name
