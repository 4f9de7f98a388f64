"""Test helpers: tiny models and tokenizers built at test time, rollout-layout batches, and running a
function on N gloo ranks with torch.multiprocessing (spawn).

Imported by the tests through ``conftest.py`` (which puts this folder on ``sys.path``) so spawned
processes can unpickle the functions defined here.
"""

from __future__ import annotations

import os
import socket
import traceback

import torch
from verl_test_models import word_tokenizer, write_causal_lm

VOCAB = 96
WORDS = ["hello", "world", "the", "cat", "sat", "on", "mat", "a", "dog", "ran", "stop", "go", "1", "2", "3", "+", "="]


def build_tiny_model(path: str, arch: str = "qwen2", tie: bool = False, layers: int = 2, seed: int = 0) -> str:
    """A random tiny causal LM (hidden 32, vocab 96) with a word-level tokenizer (<pad> 0, <eos> 1) in
    ``path``; weights drawn large enough that the outputs depend visibly on every one of them."""
    return write_causal_lm(
        path,
        word_tokenizer(WORDS, VOCAB),
        arch=arch,
        hidden_size=32,
        intermediate_size=64,
        num_layers=layers,
        num_heads=4,
        num_kv_heads=2,
        max_positions=256,
        tie=tie,
        seed=seed,
        init_std=0.2,
    )


def make_batch(
    batch: int,
    prompt_len: int,
    response_len: int,
    seed: int = 0,
    vocab: int = VOCAB,
    min_len: int = 1,
    max_len: int | None = None,
) -> dict[str, torch.Tensor]:
    """Random rollout-layout tensors: left-padded prompts ++ right-padded responses whose lengths are
    drawn from [min_len, max_len] (capped by the widths)."""
    g = torch.Generator().manual_seed(seed)
    top = max_len or max(prompt_len, response_len)
    prompt_lens = torch.randint(min_len, min(top, prompt_len) + 1, (batch,), generator=g)
    response_lens = torch.randint(min_len, min(top, response_len) + 1, (batch,), generator=g)
    prompt_mask = (torch.arange(prompt_len)[None] >= (prompt_len - prompt_lens)[:, None]).long()
    response_mask = (torch.arange(response_len)[None] < response_lens[:, None]).long()
    prompts = torch.randint(3, vocab, (batch, prompt_len), generator=g) * prompt_mask
    responses = torch.randint(3, vocab, (batch, response_len), generator=g) * response_mask
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "response_mask": response_mask,
    }


def rl_batch(n: int, prompt_len: int, response_len: int, seed: int, **lengths):
    """A DataProto in the rollout layout plus random ``advantages``, as an actor update receives it."""
    from verl.core.protocol import DataProto

    tensors = make_batch(n, prompt_len, response_len, seed=seed, **lengths)
    tensors["advantages"] = torch.randn(n, response_len, generator=torch.Generator().manual_seed(seed))
    return DataProto.from_dict(tensors, meta_info={"temperature": 0.9, "compute_entropy": True})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world_size: int, port: int, fn, args, result_dir: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size))
    os.environ["LOCAL_RANK"] = str(rank)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        result = fn(rank, world_size, *args)
        torch.save(result, os.path.join(result_dir, f"rank{rank}.pt"))
    except BaseException:
        with open(os.path.join(result_dir, f"rank{rank}.err"), "w") as f:
            f.write(traceback.format_exc())
        raise
    finally:
        dist.destroy_process_group()


def run_ranks(fn, world_size: int, *args, result_dir: str) -> list:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` gloo ranks; returns each rank's result."""
    import torch.multiprocessing as mp

    os.makedirs(result_dir, exist_ok=True)
    try:
        mp.spawn(_entry, args=(world_size, free_port(), fn, args, result_dir), nprocs=world_size, join=True)
    except Exception as exc:
        errors = [
            open(os.path.join(result_dir, name)).read()
            for name in sorted(os.listdir(result_dir))
            if name.endswith(".err")
        ]
        raise AssertionError("a rank failed:\n" + "\n".join(errors)) from exc
    return [torch.load(os.path.join(result_dir, f"rank{r}.pt"), weights_only=False) for r in range(world_size)]


def count_native_layer_steps(monkeypatch, calls: list) -> None:
    """For the rest of the test, each call of a native (C++) decoder layer step that ``fused_layer`` builds
    appends its rows to ``calls``."""
    from verl.engines.rollout.hf import fused_layer

    make = fused_layer.native_step

    def counting_native_step(w, ops):
        step = make(w, ops)
        if step is None:
            return None

        def counted(hidden, *args):
            calls.append(hidden.shape[0])
            return step(hidden, *args)

        return counted

    monkeypatch.setattr(fused_layer, "native_step", counting_native_step)
