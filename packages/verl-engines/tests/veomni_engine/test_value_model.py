"""The VeOmni value engine (critic, reward model) equals the FSDP2 value engine on a reward-model folder
(the same score head in both): values, the critic loss, gradients and the parameters after one step."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import VOCAB, WORDS, rl_batch, run_ranks
from veomni_programs import fsdp_and_veomni_values
from verl_test_models import word_tokenizer, write_sequence_classifier

pytestmark = pytest.mark.veomni

TOL = {"atol": 1e-5, "rtol": 1e-5}


def test_dp2_values_equal_fsdp2(tmp_path):
    model = write_sequence_classifier(str(tmp_path / "rm"), word_tokenizer(WORDS, VOCAB), hidden_size=32)
    batch = rl_batch(8, 8, 8, seed=5)
    ranks = run_ranks(fsdp_and_veomni_values, 2, model, batch, result_dir=str(tmp_path / "r"))
    for rank in ranks:
        fsdp, veomni = rank["fsdp"], rank["veomni"]
        torch.testing.assert_close(veomni["values"], fsdp["values"], **TOL)
        assert veomni["loss"] == pytest.approx(fsdp["loss"], rel=1e-5)
        assert "score.weight" in veomni["grads"] and veomni["grads"].keys() == fsdp["grads"].keys()
        for name, grad in fsdp["grads"].items():
            torch.testing.assert_close(veomni["grads"][name], grad, **TOL, msg=name)
        for name, param in fsdp["params"].items():
            torch.testing.assert_close(veomni["params"][name], param, **TOL, msg=name)
