"""The hybrid engine: trained weights reach the colocated hf rollout engine, on one and two ranks."""

import pytest
import torch
from engine_helpers import run_ranks
from rank_programs import hybrid_cycle

TIMINGS = ("timing_s/rollout_wake_up", "timing_s/update_weights", "timing_s/rollout_generate", "timing_s/rollout_sleep")


def check_cycle(result):
    # The rollout generated with the trained weights: greedy output changed after one update.
    assert not torch.equal(result["before"], result["after"])
    # Its weights are the actor's full weights, and its log-probs are the actor's recomputed ones.
    assert result["rollout_weights"].keys() == result["actor_weights"].keys()
    for name, value in result["actor_weights"].items():
        assert torch.equal(result["rollout_weights"][name], value), name
    mask = result["sampled"]["response_mask"].bool()
    torch.testing.assert_close(
        result["recomputed"][mask], result["sampled"]["rollout_log_probs"][mask], atol=1e-5, rtol=1e-5
    )
    assert all(key in result["metrics"] for key in TIMINGS)
    assert all(value >= 0 for value in result["metrics"].values())


@pytest.mark.parametrize("offload_actor", [False, True], ids=["cpu_default", "offload_actor"])
def test_one_rank_hybrid_shares_storage_and_syncs(tiny_model, one_process_group, offload_actor):
    result = hybrid_cycle(0, 1, tiny_model, offload_actor=offload_actor)
    check_cycle(result)
    # One rank on CPU: the rollout model aliases the training parameters (no second copy).
    assert result["shares_storage"] is not offload_actor
    # The actor is back to its resting state (everything on the device) after each generation.
    assert result["state_after_gen"] == {"model": True, "optimizer": True}
    if offload_actor:
        assert "timing_s/actor_offload" in result["metrics"] and "timing_s/actor_reload" in result["metrics"]


def test_two_rank_hybrid_gathers_and_drops_rollout_weights(tiny_model, tmp_path):
    results = run_ranks(hybrid_cycle, 2, tiny_model, None, 2, result_dir=str(tmp_path))
    for result in results:
        check_cycle(result)
        assert not result["shares_storage"]
    # Both ranks hold the same full weights (gathered from their shards).
    for name, value in results[0]["rollout_weights"].items():
        assert torch.equal(results[1]["rollout_weights"][name], value)


def test_tied_embeddings_sync(tiny_tied_model, one_process_group):
    result = hybrid_cycle(0, 1, tiny_tied_model)
    check_cycle(result)
    assert "lm_head.weight" not in result["actor_weights"]  # tied: sent once, as the input embedding
