"""Regenerate ``upstream_scripts/*.txt`` from a checkout of verl (``python refresh_upstream_scripts.py
<verl repo> <commit>``): each file holds the arguments one of verl's example scripts passes to its entry
point, with the model, data and output paths replaced by placeholders the test fills with local ones."""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent

#: name -> (script in verl's repo, entry command here, arguments the script takes)
SCRIPTS = {
    "grpo_qwen2_7b_math": ("examples/grpo_trainer/run_qwen2-7b_math.sh", "verl train", []),
    "grpo_qwen2_7b_seq_balance": ("examples/grpo_trainer/run_qwen2-7b_seq_balance.sh", "verl train", []),
    "grpo_qwen3_8b": ("examples/grpo_trainer/run_qwen3-8b.sh", "verl train", []),
    "ppo_deepseek7b": ("examples/ppo_trainer/run_deepseek7b_llm.sh", "verl train", []),
    "ppo_qwen2_7b_reward_model": ("examples/ppo_trainer/run_qwen2-7b_rm.sh", "verl train", []),
    "ppo_qwen2_7b_seq_balance": ("examples/ppo_trainer/run_qwen2-7b_seq_balance.sh", "verl train", []),
    "ppo_gemma": ("examples/ppo_trainer/run_gemma.sh", "verl train", []),
    "rloo_qwen2_7b": ("examples/rloo_trainer/run_qwen2-7b.sh", "verl train", []),
    "reinforce_pp_qwen2_7b": ("examples/reinforce_plus_plus_trainer/run_qwen2-7b_math_rf.sh", "verl train", []),
    "reinforce_pp_baseline_qwen2_7b": (
        "examples/reinforce_plus_plus_trainer/run_qwen2-7b_math_rf_baseline.sh",
        "verl train",
        [],
    ),
    "remax_qwen2_5_3b": ("examples/remax_trainer/run_qwen2.5-3b_seq_balance.sh", "verl train", []),
    "gspo_qwen2_5_3b": ("examples/gspo_trainer/test_gspo_3b_math.sh", "verl train", []),
    "gpg_qwen2_7b": ("examples/gpg_trainer/run_qwen2-7b_math.sh", "verl train", []),
    "cispo_qwen2_5_0_5b": ("examples/cispo_trainer/run_cispo_qwen2_5_0_5b_gsm8k.sh", "verl train", []),
    "otb_qwen2_5_7b": ("examples/otb_trainer/run_qwen2_5-7b.sh", "verl train", []),
    "rollout_correction": ("examples/rollout_correction/run_with_rollout_corr.sh", "verl train", []),
    "gmpo_dapo_qwen2_5_7b": ("examples/gmpo_trainer/test_dapo_7b_math.sh", "verl train", []),
    "sft_gemma_2b": ("examples/sft/gsm8k/run_gemma_2b.sh", "verl sft", ["2", "/SAVE"]),
    "sft_qwen_0_5b_sp2": ("examples/sft/gsm8k/run_qwen_05_sp2.sh", "verl sft", ["2", "/SAVE"]),
    "grpo_lora_qwen2_5_3b": ("examples/grpo_trainer/run_qwen2_5-3b_gsm8k_grpo_lora.sh", "verl train", []),
    "grpo_megatron_qwen2_7b": ("examples/grpo_trainer/run_qwen2-7b_math_megatron.sh", "verl train", []),
    # verl.experimental.one_step_off_policy.main_ppo -> the recipe that selects that schedule
    "dapo_one_step_off_qwen2_5_7b": (
        "verl/experimental/one_step_off_policy/shell/dapo_7b_math_fsdp2_64_64.sh",
        "verl train -r grpo_one_step_off",
        [],
    ),
    # Ulysses 4 with fsdp_size=2: the shard grows to the sequence-parallel group here (README)
    "dapo_one_step_off_qwen2_5_7b_4_12": (
        "verl/experimental/one_step_off_policy/shell/dapo_7b_math_fsdp2_4_12.sh",
        "verl train -r grpo_one_step_off",
        [],
    ),
    "grpo_one_step_off_qwen3_0_6b": (
        "verl/experimental/one_step_off_policy/shell/grpo_0.6b_gsm8k_fsdp2_2_6.sh",
        "verl train -r grpo_one_step_off",
        [],
    ),
    # verl.experimental.fully_async_policy.fully_async_main -> the fully async recipe
    "dapo_fully_async_qwen2_5_7b": (
        "verl/experimental/fully_async_policy/shell/dapo_7b_math_fsdp2_4_4.sh",
        "verl train -r grpo_async",
        [],
    ),
    "dapo_fully_async_qwen2_5_7b_64_64": (
        "verl/experimental/fully_async_policy/shell/dapo_7b_math_fsdp2_64_64.sh",
        "verl train -r grpo_async",
        [],
    ),
}

#: keys whose values are paths on the script author's machine -> the placeholder the test fills
PLACEHOLDERS = {
    "actor_rollout_ref.model.path": "{model}",
    "critic.model.path": "{model}",
    "model.partial_pretrain": "{model}",
    "actor_rollout_ref.model.tokenizer_path": "{model}",
    "reward_model.model.path": "{reward_model}",
    "reward_model.model.input_tokenizer": "{model}",
    "data.train_files": "{train}",
    "data.val_files": "{val}",
    "trainer.default_local_dir": "{run_dir}",
    "custom_reward_function.path": "{reward_fn}",
}


def placeholder(arg: str) -> str:
    key, sep, value = arg.partition("=")
    target = PLACEHOLDERS.get(key.lstrip("+"))
    if not sep or target is None:
        return arg
    count = len(re.findall(r"[^,\[\]'\" ]+\.(?:parquet|jsonl)", value))
    return f"{key}={target}" if count <= 1 else f"{key}=[{', '.join([target] * count)}]"


def main(repo: str, commit: str) -> None:
    out = HERE / "upstream_scripts"
    out.mkdir(exist_ok=True)
    for name, (path, entry, args) in SCRIPTS.items():
        text = subprocess.run(["git", "-C", repo, "show", f"{commit}:{path}"], check=True, capture_output=True).stdout
        with tempfile.NamedTemporaryFile("wb", suffix=".sh") as script:
            script.write(text)
            script.flush()
            printed = subprocess.run(
                ["bash", str(HERE / "extract_args.sh"), script.name, *args], capture_output=True, text=True
            ).stdout
        lines = [placeholder(a) for a in printed.splitlines() if a.strip()]
        header = f"# verl {path} at {commit}\n# entry: {entry}\n"
        (out / f"{name}.txt").write_text(header + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
