"""verl's fused CPU kernels (``rollout/hf/cpu_kernels``) against the code they replace, on random inputs:
transformers' RMSNorm and rotary embedding (the latter bit for bit) and SDPA for the one-query decode
attention; and their installation for a generate (replaced only where a probe agrees, restored after)."""

import math

import pytest
import torch
from torch.nn import functional as F
from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb
from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

from verl.engines.rollout.hf import cpu_kernels
from verl.engines.rollout.hf.cpu_kernels import (
    _norm_class_matches,
    _ops,
    compile_kernels,
    compiler_missing_reason,
    fused_cpu_kernels,
)

# Skipped only where nothing can build them; with a compiler, a failing build fails every test here.
pytestmark = pytest.mark.skipif(compiler_missing_reason() is not None, reason=f"{compiler_missing_reason()}")


@pytest.mark.parametrize("norm_class", [LlamaRMSNorm, Qwen2RMSNorm])
@pytest.mark.parametrize("shape", [(16, 1, 576), (3, 7, 36), (5, 8)])
def test_rms_norm_equals_transformers(norm_class, shape):
    torch.manual_seed(shape[-1])
    norm = norm_class(shape[-1], eps=1e-5)
    norm.weight.data.normal_()
    x = torch.randn(shape) * 4
    with torch.no_grad():
        expected = norm(x)
        torch.testing.assert_close(_ops().rms_norm(x, norm.weight, 1e-5), expected, rtol=1e-5, atol=1e-6)
        strided = torch.randn(*shape[:-1], shape[-1] * 2)[..., ::2]  # a non-contiguous input
        torch.testing.assert_close(_ops().rms_norm(strided, norm.weight, 1e-5), norm(strided), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim", "tokens"), [(9, 3, 64, 1), (4, 4, 8, 5), (8, 1, 128, 3), (2, 2, 6, 2)]
)
def test_rotary_is_bit_equal_to_transformers(heads, kv_heads, dim, tokens):
    torch.manual_seed(dim)
    rows = 4
    # Laid out as transformers' attention hands them over: views of one product, heads transposed.
    qkv = torch.randn(rows, tokens, (heads + 2 * kv_heads) * dim)
    q = qkv[..., : heads * dim].view(rows, tokens, heads, dim).transpose(1, 2)
    k = qkv[..., heads * dim : (heads + kv_heads) * dim].view(rows, tokens, kv_heads, dim).transpose(1, 2)
    cos, sin = torch.randn(rows, tokens, dim), torch.randn(rows, tokens, dim)
    for c, s in ((cos, sin), (cos[:1].expand_as(cos), sin[:1].expand_as(sin))):  # also one batch broadcast
        expected = apply_rotary_pos_emb(q, k, c, s)
        got = _ops().rotary(q, k, c, s)
        assert all(torch.equal(e, g) for e, g in zip(expected, got, strict=True))


def reference_attention(q, k, v, additive, scale):
    """In float64: softmax(q k^T * scale + additive) v, each query head against its KV head."""
    group = q.shape[1] // k.shape[1]
    k64, v64 = (t.double().repeat_interleave(group, dim=1) for t in (k, v))
    scores = q.double() @ k64.transpose(-1, -2) * scale + additive.double()
    return (torch.softmax(scores, -1) @ v64).transpose(1, 2).float()


@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(9, 3, 64), (4, 4, 8), (8, 1, 128), (6, 2, 16)])
@pytest.mark.parametrize("keys", [1, 11, 67])
def test_decode_attention_equals_sdpa_and_a_float64_softmax(heads, kv_heads, dim, keys):
    torch.manual_seed(heads * keys + dim)
    rows, slots = 5, keys + 9  # a static cache wider than the slots written so far
    q = torch.randn(rows, 1, heads * dim + 8)[..., : heads * dim].view(rows, 1, heads, dim).transpose(1, 2)
    k, v = torch.randn(rows, kv_heads, slots, dim) * 2, torch.randn(rows, kv_heads, slots, dim)
    k[:, :, keys:] = v[:, :, keys:] = float("nan")  # not written yet: must not be read
    first = torch.randint(0, keys, (rows,))
    mask = (torch.arange(slots)[None] >= first[:, None])[:, None, None, :]  # left padding
    additive = torch.zeros(mask.shape).masked_fill_(~mask, float("-inf"))
    scale = dim**-0.5
    got = _ops().decode_attention(q, k, v, additive, keys, scale)
    assert got.shape == (rows, 1, heads, dim) and not got.isnan().any()
    expected = F.scaled_dot_product_attention(
        q, k[:, :, :keys], v[:, :, :keys], attn_mask=mask[..., :keys], scale=scale, enable_gqa=True
    ).transpose(1, 2)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=2e-6)
    exact = reference_attention(q, k[:, :, :keys], v[:, :, :keys], additive[..., :keys], scale)
    torch.testing.assert_close(got, exact, rtol=1e-5, atol=2e-6)


def test_decode_attention_softmax_over_a_wide_range_of_scores():
    """Scores 0 to -100 apart: the kernel's exp must be accurate across its range and give 0 below
    underflow, as torch's softmax does."""
    torch.manual_seed(0)
    rows, heads, dim, keys = 3, 2, 8, 40
    q = torch.zeros(rows, heads, 1, dim)
    q[..., 0] = 1.0
    k = torch.zeros(rows, 1, keys, dim)
    k[:, 0, :, 0] = -torch.linspace(0, 100, keys)  # score of slot j: -100 j / 39
    v = torch.randn(rows, 1, keys, dim)
    additive = torch.zeros(rows, 1, 1, keys)
    got = _ops().decode_attention(q, k, v, additive, keys, 1.0)
    torch.testing.assert_close(got, reference_attention(q, k, v, additive, 1.0), rtol=1e-5, atol=1e-7)
    weights = torch.softmax(-torch.linspace(0, 100, keys).double(), 0)
    assert weights[-1] < 1e-40  # the last slots underflow in fp32 and add nothing
    assert math.isclose(float(got[0, 0, 0, 0]), float((weights * v[0, 0, :, 0].double()).sum()), rel_tol=1e-5)


def test_kernels_reject_what_they_do_not_take():
    q, k = torch.randn(2, 4, 1, 8), torch.randn(2, 2, 5, 8)
    with pytest.raises(RuntimeError, match="fp32 CPU tensor"):
        _ops().decode_attention(q.double(), k, k, torch.zeros(2, 1, 1, 5), 5, 1.0)
    with pytest.raises(RuntimeError, match="multiple of 8"):
        _ops().decode_attention(
            torch.randn(2, 4, 1, 6), torch.randn(2, 2, 5, 6), torch.randn(2, 2, 5, 6), torch.zeros(2, 1, 1, 5), 5, 1.0
        )
    with pytest.raises(RuntimeError, match="attends to no slot"):
        _ops().decode_attention(q, k, k, torch.full((2, 1, 1, 5), float("-inf")), 5, 1.0)
    with pytest.raises(RuntimeError, match="keys out of range"):
        _ops().decode_attention(q, k, k, torch.zeros(2, 1, 1, 5), 6, 1.0)
    # Heads beyond the kernel's registers: its wrapper declines them (torch's attention takes over).
    big_q, big_k = torch.randn(2, 4, 1, 512), torch.randn(2, 2, 5, 512)
    with pytest.raises(RuntimeError, match="at most 256"):
        _ops().decode_attention(big_q, big_k, big_k, torch.zeros(2, 1, 1, 5), 5, 1.0)
    assert cpu_kernels._attention_kernel()(big_q, big_k, big_k, torch.zeros(2, 1, 1, 5), 5, 1.0) is None


class OnePlusWeightRMSNorm(torch.nn.Module):
    """Gemma's RMSNorm: scales by 1 + weight, which the kernel does not compute."""

    def __init__(self, width: int, eps: float = 1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(width))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.weight)


def test_only_norms_that_compute_the_kernels_formula_are_replaced():
    assert _norm_class_matches(LlamaRMSNorm) and _norm_class_matches(Qwen2RMSNorm)
    assert not _norm_class_matches(OnePlusWeightRMSNorm)


def test_a_generate_replaces_norms_rotary_and_attention_and_restores_them(tiny_model):
    from transformers import AutoModelForCausalLM
    from transformers.models.qwen2 import modeling_qwen2

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32, attn_implementation="sdpa")
    ids = torch.randint(3, 90, (4, 6))
    with torch.no_grad():
        expected = model(ids).logits
        original_rotary = modeling_qwen2.apply_rotary_pos_emb
        with fused_cpu_kernels(model) as replaced:
            # No decoder layer is fused: its projections are not packed (``test_fused_layer.py`` has them).
            layers = model.config.num_hidden_layers
            assert replaced == {"norms": 2 * layers + 1, "rotary": 1, "cache_update": True, "layers": 0}
            assert modeling_qwen2.apply_rotary_pos_emb is not original_rotary
            got = model(ids).logits
        assert modeling_qwen2.apply_rotary_pos_emb is original_rotary
        assert all("forward" not in m.__dict__ for m in model.modules())
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    # With gradients (a training forward in the same process), the replaced code defers to the original.
    with fused_cpu_kernels(model):
        loss = model(ids).logits.sum()
    loss.backward()
    assert model.model.norm.weight.grad is not None


def test_the_static_cache_update_equals_transformers():
    from transformers.cache_utils import StaticLayer

    original = StaticLayer.update
    layers = {}
    for name in ("transformers", "fused"):
        torch.manual_seed(0)
        layer = layers[name] = StaticLayer(max_cache_len=12)
        update = original if name == "transformers" else cpu_kernels._fused_update(original)
        prefill = torch.randn(2, 5, 3, 8).transpose(1, 2)  # [b, 3 kv heads, 5 new, d], a view of a projection
        update(layer, prefill, prefill * 3)
        for _ in range(4):
            key = torch.randn(2, 1, 3, 8).transpose(1, 2)
            keys, values = update(layer, key, -key)
        assert keys is layer.keys and values is layer.values
    a, b = layers["transformers"], layers["fused"]
    assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
    assert int(a.cumulative_length) == int(b.cumulative_length) == 9
    with pytest.raises(RuntimeError, match="the cache has 12 slots; writing 4 at 9"):
        _ops().write_slots(b.keys, b.values, torch.randn(2, 3, 4, 8), torch.randn(2, 3, 4, 8), b.cumulative_length)
    assert cpu_kernels._update_matches(StaticLayer)


def test_a_failing_build_is_reported_not_raised():
    module, reason, _ = compile_kernels(cpu_kernels.SOURCE.read_text(), ["-fno-such-compiler-flag"])
    assert module is None and reason.startswith("building verl's CPU kernels failed")
    assert "-fno-such-compiler-flag" in reason  # the compiler's complaint, not just the command
