"""forward_only with meta_info["compute_sum_pi_squared"] returns sum_v pi_v^2 per response token (for the
optimal token baseline), equal to the value from the model's full logits."""

import pytest
import torch
from engine_helpers import rl_batch
from rank_programs import make_engine

pytestmark = pytest.mark.usefixtures("one_process_group")


@pytest.mark.parametrize("remove_padding", [True, False])
def test_sum_pi_squared_from_the_engine(tiny_model, remove_padding):
    batch = rl_batch(3, 5, 4, seed=11)
    batch.meta_info["temperature"] = 0.7
    engine = make_engine(tiny_model, use_remove_padding=remove_padding)
    with engine.eval_mode():
        plain = engine.forward_only(batch)
        batch.meta_info["compute_sum_pi_squared"] = True
        out = engine.forward_only(batch)
        t = batch.batch
        logits = engine.module(
            input_ids=t["input_ids"], attention_mask=t["attention_mask"], position_ids=t["position_ids"]
        ).logits.float()
    assert "sum_pi_squared" not in plain and torch.equal(plain["log_probs"], out["log_probs"])
    response_length = t["responses"].shape[1]
    probs = torch.softmax(logits[:, -response_length - 1 : -1] / 0.7, dim=-1)
    mask = t["response_mask"].bool()
    torch.testing.assert_close(out["sum_pi_squared"][mask], probs.square().sum(-1)[mask], atol=1e-5, rtol=1e-4)
