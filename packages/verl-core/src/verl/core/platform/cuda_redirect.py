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
- ``torch.cuda.current_device`` returns 0 and ``torch.cuda.synchronize`` does nothing.

It is for testing layouts on machines without an accelerator, not for speed. The function-mode half is
thread-local (torch keeps a mode stack per thread); the ``torch.cuda`` half is process-global while any
redirect is active, so enter it only in processes that run such a backend on the CPU platform. Entering
it again while active is allowed (the patches are reference-counted).
"""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
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


def _cuda_tensor_type(name: str) -> str:
    if name.startswith("torch.") and not name.startswith("torch.cuda.") and name.endswith("Tensor"):
        return "torch.cuda." + name[len("torch.") :]
    return name


class _CudaModulePatches:
    """``torch.cuda.current_device`` / ``synchronize`` replaced while any redirect is active."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0
        self._saved: dict[str, Any] = {}

    def acquire(self) -> None:
        with self._lock:
            if self._depth == 0:
                self._saved = {name: getattr(torch.cuda, name) for name in ("current_device", "synchronize")}
                torch.cuda.current_device = lambda: 0  # the index "cuda" means; the mode maps it to the CPU
                torch.cuda.synchronize = lambda device=None: None  # CPU work is synchronous
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
