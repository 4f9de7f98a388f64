"""Fused CPU kernels for the eager decode step: RMSNorm, rotary embedding, one-query attention, cache update.

With the products on oneDNN, a SmolLM2 decode step at 16 rows spent ~20 ms of its ~65 outside them, in
thousands of small torch operations (a norm is six, the rotary embedding of q and k fourteen, the attention two
batched products, a scale, a mask and a softmax), each a few microseconds of dispatch around almost no
work. ``torch.compile`` fuses them, but on the CPU it also takes over the products (MKL's, 1.5-2x slower
than oneDNN's on packed weights here) and costs a minute per run. These kernels (``cpu_kernels.cpp``)
replace the largest groups by one call each and leave the rest of transformers' layer as it is:

- ``rms_norm``: the Llama-family RMSNorm in fp32.
- ``rotary``: ``apply_rotary_pos_emb(q, k, cos, sin)``, the same operations in the same order
  (bit-equal results).
- ``decode_attention``: ``gqa_attention``'s one-query-per-row attention in one pass per (row, KV head),
  its query heads one after the other while its keys and values are in the core's cache.
- ``write_slots``: transformers' ``StaticLayer.update`` (an arange, two adds, two ``index_copy_``), the
  new keys and values copied into their slots.

Where the products are packed too (``packed_linear``), a Llama-layout decoder layer's whole decode step
then goes through ``fused_layer``: the same products and kernels called directly, without transformers'
module tree around them; over a static cache as one call per layer into ``LayerStep``, the C++ class of
``cpu_kernels.cpp`` that holds a layer's packed weights and makes those calls itself.

They are exact to fp32 rounding (``test_cpu_kernels.py`` checks each against transformers' code and
SDPA on random inputs; the decode-path tests check greedy tokens and log-probs through them). A module
or function is replaced only after a probe shows it computes the same numbers as the kernel (a model
whose norm or rotary embedding differs, e.g. Gemma's ``1 + weight``, keeps its own), and only for the
duration of a ``generate``; an input a kernel does not take (another dtype, gradients, odd shapes) goes
to the original code.

The kernels are compiled on first use by torch's extension builder with the machine's C++ compiler
(~40 s once per machine and environment, kept in torch's extension folder, ``TORCH_EXTENSIONS_DIR``).
Where that is impossible (no compiler), the engine decodes without them and logs why.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch

from verl.engines.rollout.hf import fused_layer, gqa_attention

SOURCE = Path(__file__).with_name("cpu_kernels.cpp")


def _compile_flags() -> list[str]:
    # Vector width by what torch itself dispatches to on this CPU: AVX2 (and FMA, which every AVX2 CPU
    # has) where it does; else the compiler's baseline for the target.
    capability = torch.backends.cpu.get_cpu_capability()
    isa = ["-mavx2", "-mfma"] if capability.startswith("AVX") else []
    return ["-O3", "-ffp-contract=off", "-fopenmp", *isa]


def compiler_missing_reason() -> str | None:
    """Why torch's extension builder cannot run here (no C++ compiler or no ninja), else None."""
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        return f"no C++ compiler ({compiler!r} is not on PATH; install g++ or clang, or set CXX)"
    if shutil.which("ninja") is None:
        return "no ninja on PATH (pip install ninja)"
    return None


def compile_kernels(source: str, flags: list[str]) -> tuple[Any, str | None, float]:
    """Builds (or loads the cached build of) ``source``: (the module, None, seconds) or (None, why not, 0)."""
    from torch.utils import cpp_extension

    # One build per source, flags, torch and environment: torch keys its cache by name, and a build for
    # another environment's torch headers must not be loaded here.
    digest = hashlib.sha256("\n".join([source, *flags, torch.__version__, sys.prefix]).encode()).hexdigest()[:12]
    start = time.perf_counter()
    try:
        module = cpp_extension.load_inline(
            f"verl_cpu_kernels_{digest}",
            cpp_sources=[source],  # binds its functions and the LayerStep class itself
            extra_cflags=flags,
            extra_ldflags=["-fopenmp"],
        )
    except Exception as exc:  # noqa: BLE001  (any build failure means: decode without the kernels)
        lines = str(exc).strip().splitlines() or [""]
        # The compiler's first error says what went wrong; the first line is only the command.
        detail = next((line for line in lines if "error" in line.lower() and line is not lines[0]), lines[0])
        return None, f"building verl's CPU kernels failed ({type(exc).__name__}: {detail.strip()[:400]})", 0.0
    return module, None, time.perf_counter() - start


@functools.cache
def _build() -> tuple[Any, str | None, float]:
    return compile_kernels(SOURCE.read_text(), _compile_flags())


def cpu_kernels_unavailable_reason() -> str | None:
    """None when the kernels are built (building them on the first call), else why they cannot be."""
    return compiler_missing_reason() or _build()[1]


def build_seconds() -> float:
    """How long this process spent building (or loading the built) kernels."""
    return _build()[2]


def _ops() -> Any:
    module, reason, _ = _build()
    if module is None:
        raise RuntimeError(reason)
    return module


def _fp32_cpu(*tensors: torch.Tensor) -> bool:
    # Called a few times per layer and step: plain attribute reads, no generator.
    for t in tensors:
        if t.dtype != torch.float32 or not t.is_cpu:
            return False
    return True


def _no_grad_needed(*tensors: torch.Tensor) -> bool:
    return not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))


# -- RMSNorm ---------------------------------------------------------------------------------------------


def _norm_eps(module: torch.nn.Module) -> float | None:
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    return float(eps) if isinstance(eps, int | float) else None


def _norm_candidates(model: torch.nn.Module) -> dict[Any, float]:
    """Leaf modules named ``*RMSNorm`` with a 1-d weight, and their epsilon (the probe decides the rest)."""
    candidates = {}
    for m in model.modules():
        weight, eps = getattr(m, "weight", None), _norm_eps(m)
        if (
            type(m).__name__.endswith("RMSNorm")
            and isinstance(weight, torch.Tensor)
            and weight.dim() == 1
            and eps is not None
            and not list(m.children())
        ):
            candidates[m] = eps
    return candidates


@functools.cache
def _norm_class_matches(cls: Any) -> bool:
    """Whether ``cls``'s forward computes the kernel's RMSNorm: probed once per class on random inputs."""
    probe = cls.__new__(cls)
    torch.nn.Module.__init__(probe)
    generator = torch.Generator().manual_seed(0)
    probe.weight = torch.nn.Parameter(torch.randn(64, generator=generator) + 1.0, requires_grad=False)
    for name in ("variance_epsilon", "eps"):
        setattr(probe, name, 1e-6)
    x = torch.randn(3, 64, generator=generator) * 3.0
    try:
        with torch.no_grad():
            expected = cls.forward(probe, x)
    except Exception:  # noqa: BLE001  (a norm whose forward needs more than weight and eps is not ours)
        return False
    got = _ops().rms_norm(x, probe.weight, 1e-6)
    return (
        isinstance(expected, torch.Tensor) and expected.shape == got.shape and torch.allclose(expected, got, 1e-5, 1e-6)
    )


def _fused_norm_forward(module: Any, eps: float):
    original = type(module).forward
    rms_norm = _ops().rms_norm

    def forward(x: torch.Tensor) -> torch.Tensor:
        if _fp32_cpu(x, module.weight) and _no_grad_needed(x, module.weight):
            return rms_norm(x, module.weight, eps)
        return original(module, x)

    return forward


# -- rotary embedding --------------------------------------------------------------------------------------


def _rotary_modules(model: torch.nn.Module) -> list:
    """The modeling modules (``transformers.models.<arch>.modeling_<arch>``) of the model's classes whose
    attention calls a module-level ``apply_rotary_pos_emb``."""
    names = {type(m).__module__ for m in model.modules()}
    modules = [sys.modules[name] for name in sorted(names) if name in sys.modules]
    return [m for m in modules if callable(getattr(m, "apply_rotary_pos_emb", None))]


@functools.cache
def _rotary_matches(function, head_dim: int) -> bool:
    """Whether ``function(q, k, cos, sin)`` is the kernel's rotary embedding, bit for bit, on random inputs."""
    generator = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 4, 3, head_dim, generator=generator), torch.randn(2, 2, 3, head_dim, generator=generator)
    cos, sin = torch.randn(2, 3, head_dim, generator=generator), torch.randn(2, 3, head_dim, generator=generator)
    try:
        expected = function(q, k, cos, sin)
        got = _ops().rotary(q, k, cos, sin)
    except Exception:  # noqa: BLE001  (another signature, or a head size the kernel does not take)
        return False
    return (
        isinstance(expected, tuple)
        and len(expected) == 2
        and all(isinstance(e, torch.Tensor) and torch.equal(e, g) for e, g in zip(expected, got, strict=True))
    )


def _fused_rotary(original):
    rotary = _ops().rotary

    def apply_rotary_pos_emb(q, k, cos, sin, *args, **kwargs):
        if (
            not args
            and kwargs.get("unsqueeze_dim", 1) == 1
            and set(kwargs) <= {"unsqueeze_dim"}
            and q.dim() == k.dim() == 4
            and cos.dim() == sin.dim() == 3
            and cos.shape == sin.shape
            and cos.shape[1:] == (q.shape[2], q.shape[3])
            and cos.shape[0] in (1, q.shape[0])
            and k.shape[0] == q.shape[0]
            and k.shape[2:] == q.shape[2:]
            and q.shape[-1] % 2 == 0
            and _fp32_cpu(q, k, cos, sin)
            and _no_grad_needed(q, k, cos, sin)
            and q.stride(-1) == k.stride(-1) == cos.stride(-1) == sin.stride(-1) == 1
        ):
            batch = (q.shape[0], *cos.shape[1:])
            return tuple(rotary(q, k, cos.expand(batch), sin.expand(batch)))
        return original(q, k, cos, sin, *args, **kwargs)

    return apply_rotary_pos_emb


# -- attention -------------------------------------------------------------------------------------------


def _attention_kernel():
    decode_attention, max_head_dim = _ops().decode_attention, _ops().MAX_HEAD_DIM

    def attend(query, key, value, additive, keys: int, scale: float):
        if (
            query.shape[-1] % 8 == 0
            and query.shape[-1] <= max_head_dim
            and _fp32_cpu(query, key, value, additive)
            and _no_grad_needed(query, key, value)
            and query.stride(-1) == key.stride(-1) == value.stride(-1) == 1
        ):
            return decode_attention(query, key, value, additive, keys, scale)
        return None

    return attend


# -- the static cache's update -----------------------------------------------------------------------------


def _static_layer_class() -> Any:
    try:
        from transformers.cache_utils import StaticLayer
    except ImportError:
        return None
    return StaticLayer


def _fused_update(original):
    write_slots = _ops().write_slots

    def update(self, key_states, value_states, *args, **kwargs):
        length = getattr(self, "cumulative_length", None)
        if (
            getattr(self, "is_initialized", False)
            and isinstance(length, torch.Tensor)
            and length.dtype == torch.int64
            and length.numel() == 1
            and _fp32_cpu(self.keys, self.values, key_states, value_states)
            and _no_grad_needed(key_states, value_states)
            and self.keys.is_contiguous()
            and self.values.is_contiguous()
            and key_states.shape == value_states.shape
            and key_states.shape[:2] == self.keys.shape[:2]
            and key_states.shape[3] == self.keys.shape[3]
            and key_states.stride(-1) == value_states.stride(-1) == 1
            and int(length) + key_states.shape[2] <= self.keys.shape[2]
        ):
            write_slots(self.keys, self.values, key_states, value_states, length)
            return self.keys, self.values
        return original(self, key_states, value_states, *args, **kwargs)

    return update


@functools.cache
def _update_matches(layer_class: Any) -> bool:
    """Whether the fused update leaves a ``layer_class`` cache as its own update does: probed once, a
    prefill and a decode step on random inputs."""
    generator = torch.Generator().manual_seed(0)
    steps = [torch.randn(2, 3, n, 8, generator=generator) for n in (3, 1)]
    states = []
    try:
        for update in (layer_class.update, _fused_update(layer_class.update)):
            layer = layer_class(max_cache_len=6)
            outputs = [update(layer, step, step * 2) for step in steps]
            states.append([*outputs[-1], layer.cumulative_length.clone()])
    except Exception:  # noqa: BLE001  (another constructor or state: keep transformers' own update)
        return False
    return all(torch.equal(a, b) for a, b in zip(*states, strict=True))


# -- all of them for a generate ----------------------------------------------------------------------------


@contextlib.contextmanager
def fused_cpu_kernels(model: torch.nn.Module):
    """Within the block, ``model``'s RMSNorms and rotary embedding (where they compute what the kernels do),
    the CPU decode attention and transformers' static cache update run through the fused kernels, and the
    decode steps of Llama-layout decoder layers whose projections are packed (``packed_linear_weights``
    entered first) through ``fused_layer``. Yields how many norm modules, rotary functions and decoder
    layers it replaced and whether it replaced the cache update."""
    config: Any = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    norms = {m: eps for m, eps in _norm_candidates(model).items() if _norm_class_matches(type(m))}  # type: ignore[arg-type]
    rotaries = [m for m in _rotary_modules(model) if _rotary_matches(m.apply_rotary_pos_emb, head_dim)]
    originals = {m: m.apply_rotary_pos_emb for m in rotaries}
    layer_class = _static_layer_class()
    original_update = layer_class.update if layer_class is not None and _update_matches(layer_class) else None
    try:
        if original_update is not None:
            layer_class.update = _fused_update(original_update)
        for module, eps in norms.items():
            module.forward = _fused_norm_forward(module, eps)
        for module, original in originals.items():
            module.apply_rotary_pos_emb = _fused_rotary(original)
        # The decoder layers' fused steps build on all of the above (and the packed products, where on).
        layers = (
            fused_layer.fused_decoder_layers(model, norms, rotaries, _ops())
            if original_update is not None
            else contextlib.nullcontext(0)
        )
        with gqa_attention.single_query_kernel(_attention_kernel()), layers as fused_layers:
            yield {
                "norms": len(norms),
                "rotary": len(rotaries),
                "cache_update": original_update is not None,
                "layers": fused_layers,
            }
    finally:
        if original_update is not None:
            layer_class.update = original_update
        for module in norms:
            module.__dict__.pop("forward", None)
        for module, original in originals.items():
            module.apply_rotary_pos_emb = original
