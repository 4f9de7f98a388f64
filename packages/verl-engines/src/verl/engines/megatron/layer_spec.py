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


def layer_spec(name: SpecName, *, qk_layernorm: bool):
    """The megatron ``ModuleSpec`` of one dense decoder layer with RMSNorm."""
    from megatron.core.models.gpt import gpt_layer_specs

    if name == "transformer_engine":
        return gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec(qk_layernorm=qk_layernorm)
    return gpt_layer_specs.get_gpt_layer_local_spec(qk_layernorm=qk_layernorm, normalization="RMSNorm")
