"""Run library code that assumes CUDA on the CPU: every "cuda" it asks for becomes "cpu".

Some training backends (Megatron-core) allocate buffers on ``"cuda"`` or ``torch.cuda.current_device()``,
call ``Tensor.cuda()`` and ``torch.cuda.synchronize()``, and assert ``tensor.type() ==
"torch.cuda.FloatTensor"``. On the CPU platform those calls are the only obstacle to running the same
parallel layouts (TP, PP) over gloo, so this redirect rewrites them instead of patching the library:

- a :class:`torch.overrides.TorchFunctionMode` rewrites a CUDA ``device`` argument (``"cuda"``,
  ``"cuda:1"``, ``torch.device("cuda")``, or the integer index ``torch.cuda.current_device()`` returns)
  to ``"cpu"``; makes ``Tensor.cuda()`` a no-op; and reports ``torch.cuda.<T>Tensor`` from ``Tensor.type()``
  (so type checks written for CUDA pass) while ``Tensor.type("torch.cuda.<T>Tensor")`` converts to the
  CPU type;
- ``torch.cuda.current_device`` returns 0 and ``torch.cuda.synchronize`` does nothing; ``torch.cuda.Stream`` /
  ``Event`` / ``current_stream`` / ``stream`` are CPU stand-ins (no-op streams, events always complete);
- a backward pass started under the redirect (``loss.backward()``, ``torch.autograd.backward``, which
  megatron's schedules call) runs its backward functions under it too (torch would otherwise run them
  with the mode popped: see ``_backward_under_redirect``);
- ``all_to_all_single`` takes split sizes given as tensors (megatron's MoE dispatcher hands CUDA runs
  numpy arrays it copied off the device).

It is for testing layouts on machines without an accelerator, not for speed. The function-mode half is
thread-local (torch keeps a mode stack per thread); the ``torch.cuda`` half is process-global while any
redirect is active, so enter it only in processes that run such a backend on the CPU platform. Entering
it again while active is allowed (the patches are reference-counted).
"""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

_CPU = torch.device("cpu")


def _is_cuda_device(value: Any) -> bool:
    if isinstance(value, torch.device):
        return value.type == "cuda"
    if isinstance(value, str):
        return value == "cuda" or value.startswith("cuda:")
    # A bare integer device means a CUDA ordinal to torch (``torch.empty(3, device=0)``).
    return isinstance(value, int) and not isinstance(value, bool)


def _cpu_tensor_type(name: str) -> str:
    """``torch.cuda.FloatTensor`` -> ``torch.FloatTensor``; anything else unchanged."""
    return "torch." + name[len("torch.cuda.") :] if name.startswith("torch.cuda.") else name


class _CudaToCpuMode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", "")
        if name == "cuda" and func is torch.Tensor.cuda:
            return args[0]  # the tensor is on the CPU already: Tensor.cuda() is a no-op
        if name == "type" and func is torch.Tensor.type:
            return self._tensor_type(args, kwargs)
        if func is torch.Tensor.backward or func is torch.autograd.backward:
            return _backward_under_redirect(func, args, kwargs)
        if name == "all_to_all_single":
            _split_sizes_to_lists(kwargs)
        if _is_cuda_device(kwargs.get("device")):
            kwargs["device"] = _CPU
        if name == "to" and func is torch.Tensor.to and len(args) > 1 and _is_cuda_device(args[1]):
            args = (args[0], _CPU, *args[2:])  # tensor.to("cuda", ...) / tensor.to(0)
        return func(*args, **kwargs)

    @staticmethod
    def _tensor_type(args, kwargs):
        tensor, rest = args[0], args[1:]
        target = rest[0] if rest else kwargs.pop("dtype", None)
        if target is None:
            # Report what the tensor would be on CUDA, so `t.type() == "torch.cuda.FloatTensor"` holds.
            return _cuda_tensor_type(torch.Tensor.type(tensor))
        if isinstance(target, str):
            target = _cpu_tensor_type(target)
        return torch.Tensor.type(tensor, target, *rest[1:], **kwargs)


def _split_sizes_to_lists(kwargs: dict) -> None:
    """On CUDA, megatron's MoE token dispatcher moves its all-to-all split sizes to the host as numpy
    arrays (only tensors that are ``is_cuda`` are moved); on the CPU they stay tensors, which
    ``all_to_all_single`` does not take: pass them as lists."""
    for key in ("output_split_sizes", "input_split_sizes"):
        if isinstance(kwargs.get(key), torch.Tensor):
            kwargs[key] = kwargs[key].tolist()


def _backward_under_redirect(func, args, kwargs):
    """Run ``Tensor.backward`` / ``torch.autograd.backward`` with the redirect active in the backward pass.

    torch pops a mode off the stack while its ``__torch_function__`` runs, and the autograd engine runs
    the backward functions with the mode stack of the moment it starts: calling ``func`` here would run
    every backward function (megatron's gather / reduce-scatter allocate on ``"cuda"`` too) outside the
    redirect, and calling it again under a fresh mode would only come back here. So this does what
    ``torch.autograd.backward`` does after its override check, under a fresh mode."""
    from torch.autograd import _make_grads, _tensor_or_tensors_to_tuple
    from torch.autograd.graph import _engine_run_backward

    if func is torch.Tensor.backward:
        names = ("tensors", "grad_tensors", "retain_graph", "create_graph")
        bound = dict(zip(names, args), **kwargs)
        if "gradient" in bound:
            bound["grad_tensors"] = bound.pop("gradient")
    else:
        names = ("tensors", "grad_tensors", "retain_graph", "create_graph", "grad_variables", "inputs")
        bound = dict(zip(names, args), **kwargs)
    tensors = bound["tensors"]
    tensors = (tensors,) if isinstance(tensors, torch.Tensor) else tuple(tensors)
    inputs = bound.get("inputs")
    inputs = () if inputs is None else (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)
    create_graph = bool(bound.get("create_graph", False))
    retain_graph = bound.get("retain_graph")
    with _CudaToCpuMode():
        grads = _make_grads(tensors, _tensor_or_tensors_to_tuple(bound.get("grad_tensors"), len(tensors)), False)
        _engine_run_backward(
            tensors,
            grads,
            create_graph if retain_graph is None else retain_graph,
            create_graph,
            inputs,
            allow_unreachable=True,
            accumulate_grad=True,
        )


def _cuda_tensor_type(name: str) -> str:
    if name.startswith("torch.") and not name.startswith("torch.cuda.") and name.endswith("Tensor"):
        return "torch.cuda." + name[len("torch.") :]
    return name


class _CpuStream(torch.cpu.Stream):
    """``torch.cpu.Stream`` whose ``record_event`` returns an (always complete) event, as CUDA's does."""

    def record_event(self, event=None):
        return event if event is not None else torch.cpu.Event()


_DEFAULT_CPU_STREAM = _CpuStream()


def _cuda_replacements() -> dict[str, Any]:
    return {
        "current_device": lambda: 0,  # the index "cuda" means; the mode maps it to the CPU
        "synchronize": lambda device=None: None,  # CPU work is synchronous
        # Side streams (megatron's MoE token dispatcher copies its split sizes on one): CPU work runs in
        # order, so a stream is a no-op and an event is always complete.
        "Stream": _CpuStream,
        "Event": torch.cpu.Event,
        "current_stream": lambda device=None: _DEFAULT_CPU_STREAM,
        "stream": lambda stream: nullcontext(),
    }


class _CudaModulePatches:
    """``torch.cuda.current_device`` / ``synchronize`` and the stream API replaced while any redirect is active."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0
        self._saved: dict[str, Any] = {}

    def acquire(self) -> None:
        with self._lock:
            if self._depth == 0:
                replacements = _cuda_replacements()
                self._saved = {name: getattr(torch.cuda, name) for name in replacements}
                for name, value in replacements.items():
                    setattr(torch.cuda, name, value)
            self._depth += 1

    def release(self) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth == 0:
                for name, value in self._saved.items():
                    setattr(torch.cuda, name, value)
                self._saved = {}

    @property
    def active(self) -> bool:
        return self._depth > 0


_PATCHES = _CudaModulePatches()


class CudaToCpuRedirect(AbstractContextManager):
    """The redirect as a context manager (see the module docstring). Each instance is entered once."""

    def __init__(self) -> None:
        self._mode: _CudaToCpuMode | None = None

    def __enter__(self) -> CudaToCpuRedirect:
        if self._mode is not None:
            raise RuntimeError("this CudaToCpuRedirect is already entered; create a new one to nest")
        _PATCHES.acquire()
        self._mode = _CudaToCpuMode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc_info) -> None:
        mode, self._mode = self._mode, None
        try:
            if mode is not None:
                mode.__exit__(*exc_info)
        finally:
            _PATCHES.release()


def cuda_redirect_active() -> bool:
    """Whether the ``torch.cuda`` patches of a redirect are in place in this process."""
    return _PATCHES.active
