"""The worker of test_loss_agg's FSDP2 test, in its own module so spawned processes can import it."""

from __future__ import annotations

import os
import socket

import torch
from algos_test_helpers import agg_reference, random_mask

from verl.algos.losses.aggregation import agg_loss, global_normalizer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fsdp_worker(rank: int, world: int, port: int, modes: list[str], errors):
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        g = torch.Generator().manual_seed(7)
        mask = random_mask(8, 6, g, empty_rows=(5,))
        x = torch.randn(8, 6, 4, generator=g)
        for mode in modes:
            check_mode(rank, world, mode, mask, x)
    except Exception as e:  # report to the parent; spawn's own error is less readable
        errors.put(f"rank {rank}: {type(e).__name__}: {e}")
        raise
    finally:
        dist.destroy_process_group()
    # Every check passed and the group is gone: leave without the interpreter's teardown, in which a thread
    # torch left behind once aborted a rank ("terminate called without an active exception", SIGABRT) in a
    # full-suite run, after its checks had passed.
    os._exit(0)


def per_token_loss(model, xs):
    return model(xs).squeeze(-1) ** 2


def check_mode(rank: int, world: int, mode: str, mask: torch.Tensor, x: torch.Tensor) -> None:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    reference_model = torch.nn.Linear(4, 1)
    model = torch.nn.Linear(4, 1)
    model.load_state_dict(reference_model.state_dict())
    fully_shard(model)
    # Single-process reference: the global loss on the whole batch.
    agg_reference(per_token_loss(reference_model, x), mask, mode, scale=6.0).backward()

    # Rank r holds rows [4r, 4r+4), cut into micro-batches of unequal sizes (FSDP needs the same
    # number of forward/backward passes on every rank, not the same sizes).
    rows = list(range(4 * rank, 4 * rank + 4))
    pieces = [rows[:1], rows[1:]] if rank == 0 else [rows[:3], rows[3:]]
    normalizer = global_normalizer([mask[p] for p in pieces], loss_scale_factor=6.0)
    assert normalizer.dp_size == world
    for k, p in enumerate(pieces):
        # Gradient accumulation: FSDP reduces (averages) over ranks only at the last micro-batch.
        model.set_requires_gradient_sync(k == len(pieces) - 1)
        agg_loss(per_token_loss(model, x[p]), mask[p], mode, normalizer).backward()
    for (name, ref_param), param in zip(reference_model.named_parameters(), model.parameters()):
        got = param.grad.full_tensor()
        if not torch.allclose(got, ref_param.grad, atol=1e-6):
            raise AssertionError(
                f"{mode} {name}: FSDP grad {got.tolist()} != global-batch grad {ref_param.grad.tolist()}"
            )
