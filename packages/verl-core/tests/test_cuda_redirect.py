"""The CPU platform's cuda -> cpu redirect (what megatron-core needs on the CPU): CUDA device arguments
become the CPU, ``Tensor.cuda()`` is a no-op, CUDA type strings are reported, ``torch.cuda`` helpers are
no-ops while active, and everything is restored on exit."""

from __future__ import annotations

import contextlib

import pytest
import torch

from verl.core.platform import CPUPlatform
from verl.core.platform.cuda_redirect import CudaToCpuRedirect, cuda_redirect_active


def test_cpu_platform_offers_the_redirect_for_megatron_only():
    platform = CPUPlatform()
    assert isinstance(platform.backend_environment("megatron"), CudaToCpuRedirect)
    assert isinstance(platform.backend_environment("fsdp"), contextlib.nullcontext)


def test_cuda_arguments_land_on_the_cpu():
    real_current_device = torch.cuda.current_device
    with CPUPlatform().backend_environment("megatron"):
        assert cuda_redirect_active()
        a = torch.zeros(3, device="cuda")
        b = torch.empty(2, device=torch.cuda.current_device())  # an integer: CUDA ordinal 0
        c = torch.tensor([1.0, 2.0], device=torch.device("cuda", 0))
        d = torch.ones(2).to("cuda:0")
        e = torch.ones(2).cuda()
        assert {t.device.type for t in (a, b, c, d, e)} == {"cpu"}
        assert torch.ones(2).type() == "torch.cuda.FloatTensor"
        assert torch.ones(2, dtype=torch.bfloat16).type() == "torch.cuda.BFloat16Tensor"
        assert torch.ones(2).type("torch.cuda.HalfTensor").dtype == torch.float16
        assert torch.ones(2).to(torch.float64).dtype == torch.float64  # other .to() calls untouched
        torch.cuda.synchronize()
    assert not cuda_redirect_active()
    assert torch.cuda.current_device is real_current_device
    assert torch.ones(2).type() == "torch.FloatTensor"
    with pytest.raises((RuntimeError, AssertionError)):
        torch.zeros(1, device="cuda")


def test_nested_redirects_restore_only_at_the_outermost_exit():
    with CudaToCpuRedirect():
        with CudaToCpuRedirect():
            assert torch.zeros(1, device="cuda").device.type == "cpu"
        assert cuda_redirect_active() and torch.zeros(1, device="cuda").device.type == "cpu"
    assert not cuda_redirect_active()
