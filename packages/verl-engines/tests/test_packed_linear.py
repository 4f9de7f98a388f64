"""oneDNN linear layers of the hf rollout: the reordered weights and the fused sibling projections give
``F.linear``'s results to fp32 rounding, whatever order or inputs the model calls them with, and leave the
model as it was."""

import pytest
import torch
from torch.nn import functional as F
from transformers import AutoModelForCausalLM

from verl.engines.rollout.hf.packed_linear import packed_linear_unsupported_reason, packed_linear_weights

pytestmark = pytest.mark.skipif(packed_linear_unsupported_reason() is not None, reason="no oneDNN linear")


class Projections(torch.nn.Module):
    """Sibling projections named as in Llama-family decoder layers, plus one that reads another input."""

    def __init__(self, bias: bool):
        super().__init__()
        torch.manual_seed(0)
        self.q_proj = torch.nn.Linear(24, 16, bias=bias)
        self.k_proj = torch.nn.Linear(24, 8, bias=bias)
        self.v_proj = torch.nn.Linear(24, 8, bias=bias)
        self.o_proj = torch.nn.Linear(16, 24, bias=bias)


def reference(layer: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, layer.weight, layer.bias)


def linear_products(fn) -> int:
    """How many oneDNN linear products ``fn()`` runs."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return sum(e.count for e in prof.key_averages() if e.key == "mkldnn::_linear_pointwise")


@pytest.mark.parametrize("bias", [False, True])
def test_fused_projections_equal_f_linear_in_any_call_order(bias):
    m = Projections(bias)
    x = torch.randn(3, 5, 24)
    expected = {name: reference(getattr(m, name), x) for name in ("q_proj", "k_proj", "v_proj")}
    with torch.no_grad(), packed_linear_weights(m, rows=3):
        for order in (("q_proj", "k_proj", "v_proj"), ("v_proj", "q_proj", "k_proj")):
            got = {name: getattr(m, name)(x) for name in order}
            for name, value in got.items():
                torch.testing.assert_close(value, expected[name], rtol=1e-5, atol=1e-5)
        assert linear_products(lambda: [m.q_proj(x), m.k_proj(x), m.v_proj(x)]) == 1


def test_members_called_with_other_inputs_compute_their_own():
    m = Projections(bias=True)
    x, y = torch.randn(4, 24), torch.randn(4, 24)
    with torch.no_grad(), packed_linear_weights(m, rows=4):
        q = m.q_proj(x)
        k = m.k_proj(y)  # another tensor: its own product, not x's columns
        torch.testing.assert_close(q, reference(m.q_proj, x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(k, reference(m.k_proj, y), rtol=1e-5, atol=1e-5)
        q_again = m.q_proj(x)
        x.mul_(2)  # the same object, modified in place: the stored product no longer applies
        v = m.v_proj(x)
        torch.testing.assert_close(v, reference(m.v_proj, x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(q_again, reference(m.q_proj, x / 2), rtol=1e-5, atol=1e-5)
        # The same member twice on one input: the second call is not served a consumed output.
        assert linear_products(lambda: [m.k_proj(y), m.k_proj(y)]) == 2
        # A layer outside the groups keeps its own reordered weight.
        h = torch.randn(4, 16)
        torch.testing.assert_close(m.o_proj(h), reference(m.o_proj, h), rtol=1e-5, atol=1e-5)


def test_a_model_runs_four_products_a_layer_and_is_restored(tiny_tied_model):
    model = AutoModelForCausalLM.from_pretrained(tiny_tied_model, dtype=torch.float32).eval()
    ids = torch.randint(3, 96, (2, 7))
    with torch.no_grad():
        expected = model(ids).logits
        with packed_linear_weights(model, rows=2):
            packed = model(ids).logits
            products = linear_products(lambda: model(ids))
        after = model(ids).logits
    torch.testing.assert_close(packed, expected, rtol=1e-4, atol=1e-5)
    # q/k/v as one product, o, gate/up as one, down; then the lm head.
    assert products == 4 * model.config.num_hidden_layers + 1
    assert not any("forward" in vars(layer) for layer in model.modules())
    assert torch.equal(after, expected)
