"""Building the model through VeOmni's own API: its parallel state (device meshes), its patched Hugging
Face model with the op kernels the platform chooses, and its FSDP2 wrapping.

VeOmni is imported here, inside functions: ``import verl.engines`` registers the engine without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from verl.engines.fsdp.sharding import sum_gradients
from verl.engines.models import VALUE_MODEL, load_config

#: The op fields of VeOmni's ``OpsImplementationConfig`` a platform chooses (its defaults are CUDA kernels).
OPS_FIELDS = (
    "attn_implementation",
    "moe_implementation",
    "cross_entropy_loss_implementation",
    "rms_norm_implementation",
    "swiglu_mlp_implementation",
    "rotary_pos_emb_implementation",
    "load_balancing_loss_implementation",
)


class VeOmniLayoutError(ValueError):
    """The requested parallel layout cannot run; the message names the setting and the fix."""


@dataclass
class VeOmniParallel:
    """What the engine keeps of VeOmni's parallel state."""

    state: Any  # veomni.distributed.parallel_state.ParallelState
    fsdp_mesh: DeviceMesh  # what FSDP2 shards over
    dp_mesh: DeviceMesh  # one dimension over the data-parallel ranks (a Ulysses group counts once)
    sp_mesh: DeviceMesh | None  # the Ulysses group, when on


def check_layout(world: int, sp: int, ep: int, device_name: str) -> None:
    """Refuse layouts VeOmni cannot run here, before any mesh is built."""
    if world < 2:
        raise VeOmniLayoutError(
            "the veomni engine needs at least 2 ranks: VeOmni applies FSDP2 only when it has ranks to shard over "
            "(on one rank it wants an accelerator and no FSDP); use trainer.n_gpus_per_node >= 2 or strategy=fsdp2"
        )
    if sp < 1 or world % sp:
        raise VeOmniLayoutError(
            f"ulysses_sequence_parallel_size={sp} must divide the {world} ranks; pick a divisor of {world}"
        )
    if ep > 1 and device_name == "cpu":
        raise VeOmniLayoutError(
            f"expert_parallel_size={ep}: VeOmni's expert parallelism needs an accelerator (its MoE token dispatch "
            "and fused MoE kernels have no CPU path); on the CPU set expert_parallel_size=1"
        )
    if ep > 1 and world % ep:
        raise VeOmniLayoutError(f"expert_parallel_size={ep} must divide the {world} ranks")


def init_parallel(sp: int, ep: int, device_name: str) -> VeOmniParallel:
    """VeOmni's meshes over the default group: FSDP2 over every rank (the Ulysses groups included, as in
    VeOmni's ``include_sp_in_fsdp``), data parallelism over world / sp groups."""
    from veomni.distributed.parallel_state import init_parallel_state

    world = dist.get_world_size()
    check_layout(world, sp, ep, device_name)
    dp = world // sp
    state = init_parallel_state(
        dp_size=dp,
        dp_shard_size=dp,
        ulysses_size=sp,
        dp_mode="fsdp2",
        device_type=device_name,
        extra_parallel_sizes=(ep,),
        extra_parallel_names=("ep",),
        name=None,  # the engine holds its state; no global registry key to collide on
    )
    dp_mesh = state.device_mesh["dp_shard"] if "dp_shard" in state.device_mesh.mesh_dim_names else state.dp_mesh
    sp_mesh = state.device_mesh["ulysses"] if sp > 1 else None
    return VeOmniParallel(state=state, fsdp_mesh=state.fsdp_mesh, dp_mesh=dp_mesh, sp_mesh=sp_mesh)


def ops_config(options: dict[str, str], attn_implementation: str):
    """VeOmni's ``OpsImplementationConfig`` from the platform's choices (``PlatformBase.backend_options``).
    ``attn_implementation`` is the model's attention at build time ("sdpa" / "eager" / VeOmni's flash)."""
    from veomni.arguments.arguments_types import OpsImplementationConfig

    unknown = sorted(set(options) - set(OPS_FIELDS))
    if unknown:
        raise ValueError(f"the platform's veomni options name unknown ops {unknown}; known: {list(OPS_FIELDS)}")
    chosen = {**options, "attn_implementation": attn_implementation}
    return OpsImplementationConfig(**chosen)


def build_model(
    model_path: str,
    model_type: str,
    *,
    trust_remote_code: bool,
    overrides: dict[str, Any],
    model_dtype: torch.dtype,
    ops: Any,
) -> torch.nn.Module:
    """VeOmni's patched model on the meta device (its FSDP2 wrapping loads the weights into the shards)."""
    from veomni.models.auto import build_foundation_model

    if model_dtype != torch.float32:
        raise ValueError(
            "the veomni engine keeps fp32 master weights (fsdp_config.model_dtype=fp32); VeOmni's mixed precision "
            "casts them for compute (fsdp_config.param_dtype)"
        )
    config = load_config(model_path, model_type, trust_remote_code, overrides)
    if model_type == VALUE_MODEL:  # VeOmni picks the patched class by the architecture's name
        config.architectures = [value_architecture(config)]
        # No LM head to tie the embeddings to (VeOmni's loader would try, from a tied causal LM's config).
        config.tie_word_embeddings = False
    return build_foundation_model(
        config, weights_path=model_path, torch_dtype="float32", init_device="meta", ops_implementation=ops
    )


def value_architecture(config: Any) -> str:
    """The token-classification class of the folder's architecture (one score per token: the values)."""
    name = (getattr(config, "architectures", None) or [""])[0]
    for suffix in ("ForCausalLM", "ForSequenceClassification", "ForTokenClassification"):
        if name.endswith(suffix):
            return name[: -len(suffix)] + "ForTokenClassification"
    raise ValueError(
        f"the veomni engine builds a value model from a causal LM or a classifier folder; architectures={name!r} "
        "is neither"
    )


def restore_head(module: torch.nn.Module, model_path: str, prefix: str = "score.") -> list[str]:
    """Put the folder's own ``score.*`` weights back into the sharded head; returns their names.

    VeOmni initialises a parameter the folder lacks by re-initialising its whole module: a reward model's
    folder holds ``score.weight`` but no ``score.bias`` (a sequence classifier has none), so VeOmni's
    loader would replace the trained head with a random one. The bias keeps VeOmni's initialisation
    (zeros, as transformers gives the FSDP engine)."""
    from safetensors import safe_open
    from torch.distributed.tensor import DTensor, distribute_tensor

    from verl.engines.model_files import _weight_files

    params = dict(module.named_parameters())
    restored = []
    for file in _weight_files(Path(model_path)):
        if file.suffix != ".safetensors":
            continue
        with safe_open(str(file), framework="pt") as f:
            for name in (key for key in f.keys() if key.startswith(prefix) and key in params):
                param, full = params[name], f.get_tensor(name)
                with torch.no_grad():
                    if isinstance(param, DTensor):
                        full = distribute_tensor(full.to(param.dtype), param.device_mesh, param.placements)
                        param.to_local().copy_(full.to_local())
                    else:
                        param.copy_(full)
                restored.append(name)
    return restored


def parallelize(
    module: torch.nn.Module,
    model_path: str,
    *,
    param_dtype: torch.dtype,
    reduce_dtype: torch.dtype,
    reshard_after_forward: bool,
    gradient_checkpointing: bool,
) -> torch.nn.Module:
    """VeOmni's FSDP2 wrapping (a ``fully_shard`` per decoder layer and the root, weights loaded as
    DTensors), then gradients summed over ranks rather than averaged: our losses scale themselves for the
    global batch (``verl.core.engine.LossFn``), as with the FSDP engine."""
    from veomni.arguments.arguments_types import MixedPrecisionConfig
    from veomni.distributed.torch_parallelize import build_parallelize_model

    names = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
    mixed = MixedPrecisionConfig(
        enable=param_dtype != torch.float32,
        param_dtype=names[param_dtype],
        reduce_dtype=names[reduce_dtype],
    )
    module = build_parallelize_model(
        module,
        weights_path=model_path,
        enable_reshard_after_forward=reshard_after_forward,
        mixed_precision=mixed,
        enable_gradient_checkpointing=gradient_checkpointing,
        init_device="meta",
    )
    sum_gradients(module, dist.get_world_size())
    return module
