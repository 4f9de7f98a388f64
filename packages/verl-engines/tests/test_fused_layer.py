"""The fused decoder layer step (``rollout/hf/fused_layer``) against transformers' own layer: the same logits
and cache to the bit over a prefill and several decode steps (Llama, and Qwen2 with its q/k/v biases), a
layer class or configuration the step does not compute left to its own forward, and every call it does not
take (a prefill, gradients, another cache) handed to the layer's forward."""

import contextlib
import dataclasses

import pytest
import torch
from engine_helpers import build_tiny_model, count_native_layer_steps
from transformers import AutoModelForCausalLM
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

from verl.engines.rollout.hf import cpu_kernels, fused_layer
from verl.engines.rollout.hf.compiled_step import forward_last_logits
from verl.engines.rollout.hf.gqa_attention import gqa_attention_name
from verl.engines.rollout.hf.packed_linear import packed_linear_weights
from verl.engines.rollout.hf.transformers_compat import new_static_cache

pytestmark = pytest.mark.skipif(
    cpu_kernels.compiler_missing_reason() is not None, reason=f"{cpu_kernels.compiler_missing_reason()}"
)

ROWS = 3


def load(path: str, **config):
    return AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation=gqa_attention_name(), **config
    ).eval()


@contextlib.contextmanager
def decoding(model):
    """What a generate on the CPU enters: packed products, then the kernels (and with them the fused layers)."""
    with torch.no_grad(), packed_linear_weights(model, ROWS), cpu_kernels.fused_cpu_kernels(model) as replaced:
        yield replaced


@contextlib.contextmanager
def own_forwards(model):
    """Within the block, every decoder layer runs its class's forward (the fused one set aside)."""
    stashed = {m: m.__dict__.pop("forward") for m in model.modules() if "forward" in m.__dict__ and hasattr(m, "mlp")}
    try:
        yield
    finally:
        for module, forward in stashed.items():
            module.forward = forward


@pytest.fixture
def fused_steps(monkeypatch):
    """The rows of every call of ``fused_step``."""
    calls = []
    step = fused_layer.fused_step

    def counting(w, ops, hidden, *args):
        calls.append(hidden.shape[0])
        return step(w, ops, hidden, *args)

    monkeypatch.setattr(fused_layer, "fused_step", counting)
    return calls


@pytest.fixture
def native_steps(monkeypatch):
    """The rows of every call of a native (C++) layer step."""
    calls: list[int] = []
    count_native_layer_steps(monkeypatch, calls)
    return calls


def decode(model, ids, mask, steps: int = 5):
    """Prefill then ``steps`` greedy one-token steps against a static cache: the logits of each forward."""
    cache = new_static_cache(model.config, ids.shape[1] + steps)
    full_mask = torch.cat([mask, mask.new_ones(len(ids), steps)], dim=1)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = [forward_last_logits(model, ids, full_mask[:, : ids.shape[1]], positions, cache)]
    # The prefill's mask covers its columns only; a step's covers every slot (causality hides later ones).
    next_pos = positions[:, -1:] + 1
    for _ in range(steps):
        token = logits[-1].argmax(-1, keepdim=True)
        logits.append(forward_last_logits(model, token, full_mask, next_pos, cache))
        next_pos = next_pos + 1
    return logits, cache


def prompts():
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 90, (ROWS, 6), generator=generator)
    mask = torch.ones(ROWS, 6, dtype=torch.long)
    mask[1, :2] = 0  # left padding
    mask[2, :1] = 0
    return ids, mask


@pytest.mark.parametrize("native", [True, False])  # false: the step's Python calls (a head over 256 wide)
@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # qwen2: biases on q/k/v
def test_the_fused_step_equals_the_layers_own_forward_to_the_bit(
    tmp_path, arch, native, fused_steps, native_steps, monkeypatch
):
    if not native:
        monkeypatch.setattr(fused_layer, "native_step", lambda w, ops: None)
    model = load(build_tiny_model(str(tmp_path / arch), arch=arch, layers=3))
    ids, mask = prompts()
    with decoding(model) as replaced:
        assert replaced["layers"] == model.config.num_hidden_layers
        fused, fused_cache = decode(model, ids, mask)
        assert fused_steps.count(ROWS) == 5 * model.config.num_hidden_layers  # every step of every layer
        assert native_steps.count(ROWS) == (5 * model.config.num_hidden_layers if native else 0)
        with own_forwards(model):
            fused_steps.clear()
            own, own_cache = decode(model, ids, mask)
            assert not fused_steps
    assert all(torch.equal(a, b) for a, b in zip(fused, own, strict=True))
    for a, b in zip(fused_cache.layers, own_cache.layers, strict=True):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
    assert all("forward" not in m.__dict__ for m in model.modules())  # restored after the block
    # And the same as transformers without any of verl's CPU paths, to fp32 rounding.
    with torch.no_grad():
        plain, _ = decode(model, ids, mask)
    for a, b in zip(fused, plain, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_calls_the_fused_step_does_not_take_go_to_the_layers_forward(tmp_path, fused_steps):
    model = load(build_tiny_model(str(tmp_path / "llama"), arch="llama"))
    ids, mask = prompts()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    full_mask = torch.cat([mask, mask.new_ones(ROWS, 2)], dim=1)
    with decoding(model):
        cache = new_static_cache(model.config, ids.shape[1] + 2)
        forward_last_logits(model, ids, mask, positions, cache)  # a prefill (several tokens a row)
        assert not fused_steps
        with torch.enable_grad():  # a step with gradients on
            logits = forward_last_logits(model, ids[:, :1], full_mask, positions[:, -1:] + 1, cache)
        assert not fused_steps and logits.requires_grad
        forward_last_logits(model, ids[:, :1], full_mask, positions[:, -1:] + 2, cache)  # the same, without
        assert fused_steps == [ROWS] * model.config.num_hidden_layers
        fused_steps.clear()
        model(input_ids=ids, attention_mask=mask, use_cache=True)  # a dynamic cache (the plain loop)
        assert not fused_steps


class ShiftedLayer(LlamaDecoderLayer):
    """A layer whose forward is not the fused step's (its output moved by one)."""

    def forward(self, hidden_states, *args, **kwargs):
        return super().forward(hidden_states, *args, **kwargs) + 1.0


def test_a_layer_class_or_configuration_the_step_does_not_compute_keeps_its_own_forward(tmp_path, fused_steps):
    path = build_tiny_model(str(tmp_path / "llama"), arch="llama")
    model = load(path)
    reference = load(path)
    for i, layer in enumerate(model.model.layers):
        shifted = ShiftedLayer(model.config, i)
        shifted.load_state_dict(layer.state_dict())
        model.model.layers[i] = shifted
        reference.model.layers[i] = ShiftedLayer(model.config, i)
        reference.model.layers[i].load_state_dict(layer.state_dict())
    ids, mask = prompts()
    with decoding(model) as replaced:  # the probe finds the class's forward different
        assert replaced["layers"] == 0
        logits, _ = decode(model, ids, mask)
    with torch.no_grad():
        expected, _ = decode(reference, ids, mask)
    for a, b in zip(logits, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert fused_layer._PROBED[ShiftedLayer] is False
    # Another activation than SiLU: the layer's configuration, checked per layer (the class probed fine).
    gelu = load(path, hidden_act="gelu")
    with decoding(gelu) as replaced:
        assert replaced["layers"] == 0
    assert ROWS not in fused_steps  # (the probe's own 2-row step aside)


@pytest.mark.parametrize("shared_prefix", [False, True])  # true: the shared prompt cache, which attends itself
def test_a_generate_through_the_fused_steps_equals_one_through_the_layers_to_the_bit(
    tiny_model, shared_prefix, fused_steps, monkeypatch
):
    from test_hf_decode_paths import engine, left_padded_prompts, padded_left

    from verl.core.engine import SamplingParams

    prompts = padded_left(left_padded_prompts(tiny_model), extra=3)
    sampling = SamplingParams(n=3, temperature=0.9, max_new_tokens=8, logprobs=True, seed=3)
    rollout = engine(tiny_model, shared_prefix=shared_prefix)
    rollout.generate(prompts, sampling)  # the first probes the layer class (the probe's step is not a decode's)
    fused_steps.clear()
    fused = rollout.generate(prompts, sampling)
    metrics, layers = fused.meta_info["metrics"], rollout.model.config.num_hidden_layers
    assert metrics["rollout/shared_prefix"] == float(shared_prefix)
    assert metrics["rollout/fused_decoder_layers"] == layers
    assert len(fused_steps) == metrics["rollout/decode_steps"] * layers  # every step of every layer
    monkeypatch.setattr(cpu_kernels.fused_layer, "fused_decoder_layers", lambda *a: contextlib.nullcontext(0))
    own = rollout.generate(prompts, sampling)
    assert own.meta_info["metrics"]["rollout/fused_decoder_layers"] == 0
    assert torch.equal(fused.batch["responses"], own.batch["responses"])
    assert torch.equal(fused.batch["rollout_log_probs"], own.batch["rollout_log_probs"])


def test_the_native_step_takes_the_heads_the_kernels_attention_takes_and_names_a_bad_call(tmp_path):
    model = load(build_tiny_model(str(tmp_path / "llama"), arch="llama"))
    ops = cpu_kernels._ops()
    with torch.no_grad(), packed_linear_weights(model, ROWS):
        w = fused_layer.layer_weights(model.model.layers[0], cpu_kernels._norm_candidates(model))
        assert w is not None and fused_layer.native_step(w, ops) is not None
        wide = dataclasses.replace(w, head_dim=ops.MAX_HEAD_DIM + 8)
        assert fused_layer.native_step(wide, ops) is None  # the Python step, whose attention goes to torch
        with pytest.raises(RuntimeError, match="head dim must be a multiple of 8"):
            fused_layer.native_step(dataclasses.replace(w, head_dim=12), ops)
        step = fused_layer.native_step(w, ops)
        hidden = torch.randn(ROWS, 2, model.config.hidden_size)  # two tokens a row: a prefill, not a step
        angles = torch.zeros(1, 1, w.head_dim)
        keys, values = torch.zeros(ROWS, w.kv_heads, 8, w.head_dim), torch.zeros(ROWS, w.kv_heads, 8, w.head_dim)
        length = torch.zeros(1, dtype=torch.long)
        with pytest.raises(RuntimeError, match="one token per row"):
            step(hidden, angles, angles, keys, values, length, torch.zeros(ROWS, 1, 1, 8), 1)
        assert not keys.any() and not values.any() and int(length) == 0  # nothing written
