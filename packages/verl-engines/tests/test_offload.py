"""Offloading parameters and optimizer state to host memory and back leaves training bit-exact."""

import pytest
import torch
from engine_helpers import rl_batch
from rank_programs import full_params, make_engine, train_step

pytestmark = pytest.mark.usefixtures("one_process_group")


def storage_ptrs(engine):
    return {n: p.to_local().data_ptr() for n, p in engine.module.named_parameters()}


def test_offload_round_trip_is_bit_exact(tiny_model):
    batches = [rl_batch(4, 6, 5, seed=s) for s in (1, 2, 3)]
    plain = make_engine(tiny_model)
    for b in batches:
        train_step(plain, b, 0, 1)

    # Offload configured between phases, plus explicit round trips between the steps.
    offloaded = make_engine(tiny_model, fsdp_config={"param_offload": True, "optimizer_offload": True})
    assert offloaded.offload_state == {"model": False, "optimizer": False}
    for b in batches:
        before = storage_ptrs(offloaded)
        train_step(offloaded, b, 0, 1)
        offloaded.load_to_device()
        offloaded.offload_to_host()
        assert storage_ptrs(offloaded) != before  # the weights really moved to new storage
    with offloaded.eval_mode():
        got = full_params(offloaded)
    want = full_params(plain)
    for name in want:
        assert torch.equal(got[name], want[name]), name
    state_plain = plain.optimizer.state_dict()["state"]
    offloaded.load_to_device()
    state_off = offloaded.optimizer.state_dict()["state"]
    for key in state_plain:
        for field in ("exp_avg", "exp_avg_sq", "step"):
            a, b = state_plain[key][field], state_off[key][field]
            a = a.full_tensor() if hasattr(a, "full_tensor") else a
            b = b.full_tensor() if hasattr(b, "full_tensor") else b
            assert torch.equal(a, b), (key, field)


def test_compute_outside_its_mode_is_refused(tiny_model):
    engine = make_engine(tiny_model, fsdp_config={"param_offload": True})
    with pytest.raises(RuntimeError, match="inside engine.eval_mode"):
        engine.forward_only(rl_batch(2, 4, 3, seed=0))
    with pytest.raises(RuntimeError, match="load_to_device"):
        next(engine.named_full_parameters())
