"""``WeightChannel``: one sender, many receivers, in real processes over gloo; bit-exact tensors of every
dtype, cut into buckets both sides agree on."""

from __future__ import annotations

import io
import multiprocessing
import traceback

import pytest
import torch

from verl.core.platform import get_platform
from verl.core.rendezvous import join_store, serve_store
from verl.core.weight_channel import ALIGN, TensorSpec, WeightChannel, buckets, manifest_of

TIMEOUT_S = 60.0


def weights() -> list[tuple[str, torch.Tensor]]:
    """Every dtype a checkpoint holds, odd sizes (so offsets need aligning), a scalar, and one tensor larger
    than the test's buckets."""
    g = torch.Generator().manual_seed(0)
    return [
        ("embed.weight", torch.randn(7, 5, generator=g)),
        ("norm.weight", torch.randn(3, generator=g).to(torch.bfloat16)),
        ("scale", torch.tensor(2.5)),
        ("half.weight", torch.randn(5, 3, generator=g).to(torch.float16)),
        ("step", torch.tensor([3, -1, 7], dtype=torch.int64)),
        ("mask", torch.tensor([True, False, True])),
        ("big.weight", torch.randn(40, 33, generator=g)),
        ("last.bias", torch.randn(1, generator=g).to(torch.bfloat16)),
    ]


def _as_bytes(named: list) -> bytes:
    """Tensors through a multiprocessing queue as plain bytes (torch would share their memory with this
    process, which exits before the test reads them)."""
    buffer = io.BytesIO()
    torch.save(named, buffer)
    return buffer.getvalue()


def _member(rank: int, world: int, port: int, bucket_bytes: int, results) -> None:
    try:
        platform = get_platform()
        store = (
            serve_store("127.0.0.1", world, TIMEOUT_S) if rank == 0 else join_store("127.0.0.1", port, world, TIMEOUT_S)
        )
        if rank == 0:
            results.put(("port", int(store.port)))
        channel = WeightChannel.join(store, rank, world, TIMEOUT_S, platform, bucket_bytes=bucket_bytes)
        manifest = manifest_of(weights())
        for _ in range(2):  # a channel carries every sync of a run
            if rank == 0:
                results.put(("sent", channel.send(iter(weights()), manifest)))
            else:
                got = [(name, tensor.clone()) for name, tensor in channel.receive(manifest)]
                results.put((rank, _as_bytes(got)))
    except BaseException:
        results.put(("error", traceback.format_exc()))


@pytest.mark.parametrize("bucket_bytes", [64, 2**20])
def test_every_receiver_gets_the_senders_tensors_bit_for_bit(bucket_bytes):
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    world = 3
    sender = context.Process(target=_member, args=(0, world, 0, bucket_bytes, results))
    sender.start()
    kind, port = results.get(timeout=TIMEOUT_S)
    assert kind == "port", port
    receivers = [context.Process(target=_member, args=(r, world, port, bucket_bytes, results)) for r in (1, 2)]
    for process in receivers:
        process.start()
    got: dict = {1: [], 2: []}
    sent = []
    for _ in range(2 * world):
        who, value = results.get(timeout=TIMEOUT_S)
        assert who != "error", value
        if who == "sent":
            sent.append(value)
        else:
            got[who].append(torch.load(io.BytesIO(value)))
    for process in (sender, *receivers):
        process.join(TIMEOUT_S)
        assert process.exitcode == 0
    expected = weights()
    padded = sum(TensorSpec.of(name, t).padded_nbytes for name, t in expected)
    assert sent == [padded, padded]
    for rank in (1, 2):
        assert len(got[rank]) == 2
        for received in got[rank]:
            assert [name for name, _ in received] == [name for name, _ in expected]
            for (_, mine), (_, theirs) in zip(received, expected):
                assert mine.dtype == theirs.dtype and mine.shape == theirs.shape
                assert torch.equal(mine, theirs)


def test_buckets_keep_the_order_and_the_bound_and_a_large_tensor_travels_alone():
    manifest = manifest_of(weights())
    cut = buckets(manifest, 64)
    assert [spec for bucket in cut for spec in bucket] == manifest
    big = next(spec for spec in manifest if spec.name == "big.weight")
    assert [big] in cut
    for bucket in cut:
        assert len(bucket) == 1 or sum(spec.padded_nbytes for spec in bucket) <= 64
    assert all(spec.padded_nbytes % ALIGN == 0 for spec in manifest)
    assert len(buckets(manifest, 2**20)) == 1


def test_a_sender_whose_weights_differ_from_the_manifest_names_the_tensor():
    """A channel of one (the sender alone) checks without anyone to wait for."""
    store = serve_store("127.0.0.1", 1, TIMEOUT_S)
    channel = WeightChannel.join(store, 0, 1, TIMEOUT_S, get_platform())
    manifest = manifest_of(weights())
    changed = weights()
    changed[1] = ("norm.weight", torch.zeros(4, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"the weights changed since the channel opened: .*norm.weight.*\(4,\)"):
        channel.send(iter(changed), manifest)
    with pytest.raises(ValueError, match="the weights ended before 'last.bias'"):
        channel.send(iter(weights()[:-1]), manifest)
    with pytest.raises(ValueError, match="the weights have 'extra', which the channel's manifest does not list"):
        channel.send(iter([*weights(), ("extra", torch.zeros(1))]), manifest)
    with pytest.raises(RuntimeError, match="channel rank 0 sends; it cannot receive"):
        next(channel.receive(manifest))
