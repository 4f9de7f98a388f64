"""Learning-rate schedules against their formulas, through the LambdaLR the engine uses."""

import math

import pytest
import torch

from verl.engines.fsdp.optim import build_lr_scheduler, build_optimizer, lr_multiplier
from verl.engines.optim_config import OptimConfig


def lrs_over(config: OptimConfig, steps: int) -> list[float]:
    param = torch.nn.Parameter(torch.zeros(2))
    opt = build_optimizer([param], config)
    sched = build_lr_scheduler(opt, config)
    lrs = []
    for _ in range(steps):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return lrs


def test_warmup_then_constant():
    lrs = lrs_over(OptimConfig(lr=1.0, lr_warmup_steps=4), 8)
    assert lrs == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0, 1.0, 1.0, 1.0])


def test_warmup_ratio_uses_total_steps():
    config = OptimConfig(lr=2.0, lr_warmup_steps_ratio=0.2, total_training_steps=10)
    assert config.warmup_steps() == 2
    assert lrs_over(config, 4) == pytest.approx([1.0, 2.0, 2.0, 2.0])


def test_cosine_decay_to_min_ratio():
    config = OptimConfig(
        lr=1.0, lr_warmup_steps=2, lr_scheduler_type="cosine", total_training_steps=12, min_lr_ratio=0.1
    )
    lrs = lrs_over(config, 14)
    expected = []
    for step in range(14):
        if step < 2:
            expected.append((step + 1) / 2)
        else:
            progress = min(1.0, (step - 2) / 10)
            expected.append(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
    assert lrs == pytest.approx(expected)
    assert lrs[-1] == pytest.approx(0.1)  # held at the minimum after the last step
    assert all(a >= b for a, b in zip(lrs[2:], lrs[3:]))  # monotone decay


def test_no_warmup_starts_at_peak():
    assert lr_multiplier(0, warmup_steps=0, schedule="constant") == 1.0
    assert lr_multiplier(0, warmup_steps=0, schedule="cosine", total_steps=5) == pytest.approx(1.0)


def test_config_errors_name_the_key():
    with pytest.raises(ValueError, match="lr_scheduler_type='linear'"):
        OptimConfig(lr_scheduler_type="linear")
    with pytest.raises(ValueError, match="total_training_steps"):
        OptimConfig(lr_warmup_steps_ratio=0.1).warmup_steps()
    with pytest.raises(ValueError, match="total_training_steps"):
        build_lr_scheduler(
            build_optimizer([torch.nn.Parameter(torch.zeros(1))], OptimConfig()),
            OptimConfig(lr_scheduler_type="cosine"),
        )
