"""Which megatron layer spec builds the transformer blocks on this platform.

Transformer Engine's spec (fused kernels, layer norms folded into the following linear layers) where TE
is importable and the platform is CUDA; megatron's local spec (plain torch modules) everywhere else: on
the CPU (no TE there) and on Ascend NPUs (MindSpeed patches the local modules). The two specs name some
weights differently, which the weight converter reads from :func:`spec_name`.
"""

from __future__ import annotations

import importlib.util
from typing import Literal

SpecName = Literal["transformer_engine", "local"]


def transformer_engine_available() -> bool:
    """Whether ``transformer_engine`` can be found (not imported: that initialises CUDA)."""
    return importlib.util.find_spec("transformer_engine") is not None


def spec_name(device_name: str, te_available: bool | None = None) -> SpecName:
    """ "transformer_engine" on CUDA with TE installed, else "local"."""
    if te_available is None:
        te_available = transformer_engine_available()
    return "transformer_engine" if device_name == "cuda" and te_available else "local"


def layer_spec(name: SpecName, *, qk_layernorm: bool, num_experts: int | None = None):
    """The megatron ``ModuleSpec`` of one decoder layer with RMSNorm: a dense MLP, or (``num_experts``) an
    MoE layer with one plain MLP per expert (``SequentialMLP``: no grouped GEMM)."""
    from megatron.core.models.gpt import gpt_layer_specs

    if num_experts:
        patch_moe_without_transformer_engine()
    if name == "transformer_engine":
        return gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec(
            num_experts=num_experts, moe_grouped_gemm=False, qk_layernorm=qk_layernorm
        )
    return gpt_layer_specs.get_gpt_layer_local_spec(
        num_experts=num_experts, moe_grouped_gemm=False, qk_layernorm=qk_layernorm, normalization="RMSNorm"
    )


def patch_moe_without_transformer_engine() -> None:
    """megatron-core 0.16.1's router (``moe_utils.RouterGatingLinearFunction``) tests
    ``te_general_gemm is not None`` but only defines that name when Transformer Engine imports: without TE
    every MoE forward fails with ``NameError: name 'te_general_gemm' is not defined``. Define it as None
    (what the check means: no TE GEMM, use torch's) where TE is absent; nothing changes where it is there."""
    from megatron.core.transformer.moe import moe_utils

    if not moe_utils.HAVE_TE and not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
