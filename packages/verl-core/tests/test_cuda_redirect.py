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


class _AllocatesOnCudaInBackward(torch.autograd.Function):
    """What megatron's sequence-parallel gather / reduce-scatter do: allocate on "cuda" in backward."""

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return torch.full(grad.shape, 3.0, device=torch.cuda.current_device()) * grad


def test_backward_functions_run_under_the_redirect():
    """torch pops a mode while it handles ``Tensor.backward`` / ``torch.autograd.backward``: the redirect
    must still cover the backward functions those start, with every argument form honoured."""
    with CudaToCpuRedirect():
        x = torch.ones(3, requires_grad=True)
        _AllocatesOnCudaInBackward.apply(x).sum().backward()
        assert torch.equal(x.grad, torch.full((3,), 3.0))
        y = torch.ones(3, requires_grad=True)
        out = _AllocatesOnCudaInBackward.apply(y)
        torch.autograd.backward([out], grad_tensors=[torch.full((3,), 2.0)], retain_graph=True)
        out.backward(torch.ones(3), inputs=[y])  # the graph was kept: accumulate once more
        assert torch.equal(y.grad, torch.full((3,), 9.0))
        z, w = torch.ones(2, requires_grad=True), torch.ones(2, requires_grad=True)
        torch.autograd.backward(_AllocatesOnCudaInBackward.apply(z * w).sum(), inputs=(w,))
        assert z.grad is None and torch.equal(w.grad, torch.full((2,), 3.0))


def test_cuda_streams_are_cpu_stand_ins_while_active():
    real_stream = torch.cuda.Stream
    with CudaToCpuRedirect():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            pass
        event = side.record_event()
        event.synchronize()
        assert event.query()
    assert torch.cuda.Stream is real_stream


ALL_TO_ALL_PROGRAM = """
import socket

import torch
import torch.distributed as dist

from verl.core.platform.cuda_redirect import CudaToCpuRedirect

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
with CudaToCpuRedirect():
    out = torch.empty(3)
    dist.all_to_all_single(
        out, torch.arange(3.0), output_split_sizes=torch.tensor([3]), input_split_sizes=torch.tensor([3])
    )
assert torch.equal(out, torch.arange(3.0)), out
dist.destroy_process_group()
"""


def test_all_to_all_takes_split_sizes_as_tensors():
    """megatron's MoE token dispatcher passes split sizes that on CUDA it copied to numpy; on the CPU they
    stay tensors, which ``all_to_all_single`` refuses unless the redirect turns them into lists. In a fresh
    process: this one may already hold a default process group from another test."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", ALL_TO_ALL_PROGRAM], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
