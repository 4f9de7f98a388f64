"""What the VeOmni engine refuses, with a message naming the setting and the fix."""

from __future__ import annotations

import pytest

from verl.engines.fsdp.ulysses import UlyssesConfigError
from verl.engines.veomni import VeOmniEngineConfig
from verl.engines.veomni.build import VeOmniLayoutError, check_layout

pytestmark = pytest.mark.veomni


def test_expert_parallelism_is_refused_on_the_cpu():
    with pytest.raises(VeOmniLayoutError, match="expert_parallel_size=2: .*needs an accelerator"):
        check_layout(world=4, sp=1, ep=2, device_name="cpu")
    check_layout(world=4, sp=1, ep=2, device_name="cuda")  # wired for accelerators


def test_ulysses_with_an_attention_that_cannot_split_heads_is_refused():
    # VeOmni's own eager/sdpa attentions run Ulysses silently wrong; only our packed sdpa splits heads.
    with pytest.raises(UlyssesConfigError, match="attn_implementation='eager' is not supported"):
        VeOmniEngineConfig(ulysses_sequence_parallel_size=2, attn_implementation="eager")
    with pytest.raises(UlyssesConfigError, match="use_remove_padding=true"):
        VeOmniEngineConfig(ulysses_sequence_parallel_size=2, use_remove_padding=False)


def test_layouts_veomni_cannot_run_are_refused():
    with pytest.raises(VeOmniLayoutError, match="at least 2 ranks"):
        check_layout(world=1, sp=1, ep=1, device_name="cpu")
    with pytest.raises(VeOmniLayoutError, match="ulysses_sequence_parallel_size=3 must divide the 4 ranks"):
        check_layout(world=4, sp=3, ep=1, device_name="cpu")
    with pytest.raises(ValueError, match="does not train LoRA"):
        VeOmniEngineConfig(lora={"lora_rank": 8})
    with pytest.raises(ValueError, match="expert_parallel_size=0"):
        VeOmniEngineConfig(expert_parallel_size=0)
