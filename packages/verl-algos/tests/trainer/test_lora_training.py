"""LoRA from ``verl train`` with verl's keys: the KL reference is the actor's base model with the adapter off
(zero KL before the first update, non-zero after), the rollout receives only the adapter after the base weights,
checkpoints hold adapters only and resume exactly, and ``verl export`` writes the merged model or the PEFT
adapter, which agree."""

from __future__ import annotations

import json

import pytest
import torch

from verl.algos.config import load_config
from verl.algos.run import checkpoint_layout as layout
from verl.algos.tracking import read_metrics
from verl.algos.trainer.export import export_checkpoint
from verl.algos.trainer.main import run
from verl.core.config import ConfigError

pytestmark = pytest.mark.usefixtures("ray_session")


def short_run(out, steps: int) -> list[str]:
    """``steps`` steps on two CPU workers, a checkpoint at the last, no validation."""
    return [
        f"trainer.default_local_dir={out}",
        f"trainer.total_training_steps={steps}",
        f"trainer.save_freq={steps}",
        "trainer.test_freq=0",
        "trainer.val_before_train=false",
        "trainer.n_gpus_per_node=2",
        "trainer.logger=[file]",
        "data.train_batch_size=2",
        "data.max_response_length=8",
    ]


def lora_grpo(model_dir, out, steps: int):
    return load_config(
        "grpo",
        [
            f"actor_rollout_ref.model.path={model_dir}",
            "actor_rollout_ref.model.lora_rank=4",
            "actor_rollout_ref.model.lora_alpha=8",
            "actor_rollout_ref.model.target_modules=all-linear",
            "actor_rollout_ref.actor.use_kl_loss=true",
            "actor_rollout_ref.actor.kl_loss_coef=0.1",
            # the tiny model's rewards are all equal (zero advantages): the entropy term moves the adapter
            "actor_rollout_ref.actor.entropy_coeff=0.05",
            "actor_rollout_ref.actor.optim.lr=5e-2",
            "actor_rollout_ref.rollout.n=2",
            *short_run(out, steps=steps),
        ],
    )


def test_lora_grpo_run_with_kl_to_the_base_model_both_exports_and_an_exact_resume(tiny_model_dir, tmp_path):
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    out = tmp_path / "run"
    run(lora_grpo(tiny_model_dir, out, steps=2))
    metrics = read_metrics(str(out))
    # the adapter starts at zero: the policy is the base model, so the KL to the reference is exactly 0;
    # after one update the adapter moved and the reference (adapter off) did not
    assert metrics[0]["actor/kl_loss"] == 0.0 and metrics[0]["actor/grad_norm"] > 0
    assert metrics[1]["actor/kl_loss"] > 0.0
    # the hf rollout serves the adapter in place: after the base weights, only the adapter is synced
    assert all(m["weight_sync/adapter_only"] == 1.0 for m in metrics)

    checkpoint = layout.latest_complete(out)
    assert checkpoint is not None
    with open(checkpoint / "actor" / "engine_state.json") as f:
        assert json.load(f)["extra"]["lora"]["lora_rank"] == 4
    merged = export_checkpoint(str(checkpoint), str(tmp_path / "merged"))
    adapter = export_checkpoint(str(checkpoint), str(tmp_path / "adapter"), adapter_only=True)
    with open(f"{adapter}/adapter_config.json") as f:
        assert json.load(f)["r"] == 4

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    expected = PeftModel.from_pretrained(base, adapter).merge_and_unload().state_dict()
    exported = AutoModelForCausalLM.from_pretrained(merged).state_dict()
    moved = 0
    for name, tensor in expected.items():
        torch.testing.assert_close(exported[name], tensor, atol=1e-6, rtol=1e-6)
        moved += not torch.equal(tensor, AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()[name])
    assert moved > 0

    # resumed from its adapter-only checkpoint, the run takes the third step an uninterrupted run takes
    straight = tmp_path / "straight"
    run(lora_grpo(tiny_model_dir, out, steps=3))
    run(lora_grpo(tiny_model_dir, straight, steps=3))
    last = {k: v for k, v in read_metrics(str(out))[-1].items() if not k.startswith(("timing_s/", "perf/"))}
    assert last["step"] == 3
    assert last == {k: read_metrics(str(straight))[-1][k] for k in last}
    adapters = [
        load_file(
            f"{export_checkpoint(str(layout.latest_complete(d)), str(tmp_path / f'{d.name}-adapter'), adapter_only=True)}/adapter_model.safetensors"
        )
        for d in (out, straight)
    ]
    assert adapters[0].keys() == adapters[1].keys()
    assert all(torch.equal(adapters[0][k], adapters[1][k]) for k in adapters[0])


def test_lora_settings_the_engine_cannot_run_are_refused_before_ray(tiny_model_dir):
    from verl.algos.config.consistency import check_consistency

    cfg = load_config("grpo", ["actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.actor.strategy=megatron"])
    with pytest.raises(ConfigError, match="LoRA runs in the FSDP engine"):
        check_consistency(cfg)
    with pytest.raises(ConfigError, match="lora_rank=-2 must be >= 0"):
        load_config("grpo", ["actor_rollout_ref.model.lora_rank=-2"])


def test_ppo_with_a_lora_critic(tiny_model_dir, tmp_path):
    """critic.model.lora_rank: the critic trains adapters and its value head; its checkpoint holds only those."""
    from safetensors import safe_open

    out = tmp_path / "run"
    run(
        load_config(
            "ppo",
            [
                f"actor_rollout_ref.model.path={tiny_model_dir}",
                f"critic.model.path={tiny_model_dir}",
                "critic.model.lora_rank=4",
                *short_run(out, steps=1),
            ],
        )
    )
    assert read_metrics(str(out))[0]["critic/grad_norm"] > 0
    critic = layout.latest_complete(out) / "critic"
    with open(critic / "engine_state.json") as f:
        assert json.load(f)["extra"]["lora"]["lora_rank"] == 4
    keys = set()
    for name in (critic / "state").iterdir():
        if name.suffix == ".safetensors":
            with safe_open(str(name), "pt") as f:
                keys |= {k for k in f.keys() if k.startswith("model.")}
    assert keys and all(".lora_A." in k or ".lora_B." in k or ".score." in k for k in keys)
    assert any(".score." in k for k in keys)
