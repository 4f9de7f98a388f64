"""Engine options on one rank: activation checkpointing, clipping, non-finite gradients, mixed
precision, the value model (critic) and its export."""

import math

import pytest
import torch
from engine_helpers import rl_batch
from rank_programs import full_params, make_engine, token_mean_loss, train_step

from verl.engines.fsdp import FSDPEngineConfig, FSDPValueEngine

pytestmark = pytest.mark.usefixtures("one_process_group")


def test_activation_checkpointing_gives_the_same_gradients(tiny_model):
    batch = rl_batch(4, 6, 5, seed=3)
    plain = train_step(make_engine(tiny_model), batch, 0, 1)
    engine = make_engine(tiny_model, enable_gradient_checkpointing=True)
    module = engine.module
    assert (
        module.is_activation_checkpointing
        if hasattr(module, "is_activation_checkpointing")
        else module.is_gradient_checkpointing
    )
    ckpt = train_step(engine, batch, 0, 1)
    for name, grad in plain["grads"].items():
        torch.testing.assert_close(ckpt["grads"][name], grad, atol=1e-6, rtol=1e-5)


def test_clipping_reports_the_pre_clip_norm_and_clips(tiny_model):
    batch = rl_batch(4, 6, 5, seed=4)
    engine = make_engine(tiny_model, optim={"lr": 1.0, "clip_grad": 1e-3, "betas": (0.0, 0.999), "weight_decay": 0.0})
    with engine.train_mode():
        engine.forward_backward(batch, token_mean_loss)
        norm = math.sqrt(sum(float(p.grad.full_tensor().pow(2).sum()) for p in engine.module.parameters()))
        reported = engine.optimizer_step()
        clipped = math.sqrt(sum(float(p.grad.full_tensor().pow(2).sum()) for p in engine.module.parameters()))
    assert reported == pytest.approx(norm, rel=1e-5) and reported > 1e-2
    assert clipped == pytest.approx(1e-3, rel=1e-4)


def test_non_finite_gradients_skip_the_update(tiny_model):
    engine = make_engine(tiny_model)
    before = full_params(engine)

    def nan_loss(outputs, micro):
        return outputs["log_probs"].sum() * float("nan"), {}

    with engine.train_mode():
        engine.forward_backward(rl_batch(2, 4, 3, seed=0), nan_loss)
        assert math.isnan(engine.optimizer_step())
    for name, value in full_params(engine).items():
        assert torch.equal(value, before[name])


def test_bf16_compute_stays_close_to_fp32(tiny_model):
    batch = rl_batch(4, 6, 5, seed=5)
    out = {}
    for dtype in ("fp32", "bf16"):
        engine = make_engine(tiny_model, fsdp_config={"param_dtype": dtype})
        with engine.eval_mode():
            out[dtype] = engine.forward_only(batch)["log_probs"]
        assert next(engine.module.parameters()).dtype == torch.float32  # master weights stay fp32
    mask = batch.batch["response_mask"].bool()
    assert not torch.equal(out["bf16"], out["fp32"])
    torch.testing.assert_close(out["bf16"][mask], out["fp32"][mask], atol=0.1, rtol=0.05)


def test_value_model_trains_and_exports(tiny_model, tmp_path):
    from transformers import AutoModelForTokenClassification

    critic = FSDPValueEngine(FSDPEngineConfig(model_path=tiny_model, optim={"lr": 3e-2}))
    critic.initialize()
    batch = rl_batch(6, 5, 4, seed=6)
    returns = torch.full((6, 4), 0.5)

    def value_loss(outputs, micro):
        mask = micro.batch["response_mask"].float()
        loss = ((outputs["values"] - 0.5) ** 2 * mask).sum() / micro.meta_info["global_response_tokens"]
        return loss, {"vf_loss": loss.detach()}

    losses = []
    for _ in range(8):
        with critic.train_mode():
            critic.optimizer_zero_grad()
            losses.append(critic.forward_backward(batch, value_loss)["vf_loss"][0])
            critic.optimizer_step()
    assert losses[-1] < losses[0] / 4
    with critic.eval_mode():
        values = critic.forward_only(batch)["values"]
    mask = batch.batch["response_mask"].bool()
    assert (values[mask] - returns[mask]).abs().mean() < 0.3

    critic.export_hf(str(tmp_path / "critic"))
    exported = AutoModelForTokenClassification.from_pretrained(str(tmp_path / "critic"))
    t = batch.batch
    with torch.no_grad():
        logits = exported(
            input_ids=t["input_ids"], attention_mask=t["attention_mask"], position_ids=t["position_ids"]
        ).logits
    width = t["responses"].shape[1]
    expected = logits[:, -width - 1 : -1, 0] * t["response_mask"]
    torch.testing.assert_close(expected, values, atol=1e-5, rtol=1e-5)


def test_override_config_reaches_the_model_and_a_wrong_attribute_is_named(tiny_model):
    engine = make_engine(tiny_model, override_config={"rms_norm_eps": 1e-3})
    assert engine.hf_config.rms_norm_eps == 1e-3
    assert engine.module.config.rms_norm_eps == 1e-3
    with pytest.raises(ValueError, match="model.override_config.no_such_field: the Qwen2Config"):
        make_engine(tiny_model, override_config={"no_such_field": 1})


def test_override_config_reaches_the_hf_rollout_model(tiny_model):
    from verl.engines.rollout.hf import HFRolloutConfig, HFRolloutEngine

    rollout = HFRolloutEngine(HFRolloutConfig(model_path=tiny_model, override_config={"rms_norm_eps": 1e-3}))
    assert rollout.model.config.rms_norm_eps == 1e-3
