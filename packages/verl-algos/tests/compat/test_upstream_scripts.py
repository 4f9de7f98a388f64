"""verl's own example run scripts carry over: each stored argument list (``upstream_scripts/*.txt``, made
by ``refresh_upstream_scripts.py`` from verl's repository) goes through every check ``verl train`` /
``verl sft`` runs before Ray starts, on a tiny local model and data, and the resolved config holds every
value the script gives: under the same key, under our key for the same setting, or listed as accepted with
no effect here. Scripts that ask for features not built yet must be refused with a message naming them."""

from __future__ import annotations

import copy
import functools
import math
from pathlib import Path
from typing import Any

import pytest
from algos_test_helpers import write_tiny_model, write_tiny_reward_model

from verl.algos.config.sft_schema import SFTConfig
from verl.algos.config.verl_compat import VerlKeys
from verl.core.config import DELETE, ConfigError, build_config, check_key, parse_override

HERE = Path(__file__).parent
SCRIPTS = sorted((HERE / "upstream_scripts").glob("*.txt"))

#: scripts that use a feature verl has and we do not yet -> a fragment of the refusal
REFUSED = {
    "grpo_megatron_qwen2_7b": "ppo_megatron_trainer",
    "grpo_qwen2_7b_seq_balance": "backend='sglang'",
}


def read_script(path: Path) -> tuple[str, list[str]]:
    lines = path.read_text().splitlines()
    entry = next(line.split(":", 1)[1].strip() for line in lines if line.startswith("# entry:"))
    return entry, [line for line in lines if line and not line.startswith("#")]


@pytest.fixture(scope="module")
def local_paths(tmp_path_factory) -> dict[str, str]:
    import pandas as pd

    root = tmp_path_factory.mktemp("upstream")
    rows = [
        {
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": f"What is {i}+1? Answer with a number."}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(i + 1)},
            "extra_info": {"index": i, "question": f"What is {i}+1?", "answer": f"#### {i + 1}"},
        }
        for i in range(4100)  # the scripts' largest train_batch_size is 4096
    ]
    pd.DataFrame(rows).to_parquet(root / "train.parquet")
    pd.DataFrame(rows[:64]).to_parquet(root / "test.parquet")
    reward_fn = root / "reward.py"
    reward_fn.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n"
    )
    return {
        "model": write_tiny_model(str(root / "model")),
        "reward_model": write_tiny_reward_model(str(root / "rm")),
        "train": str(root / "train.parquet"),
        "val": str(root / "test.parquet"),
        "run_dir": str(root / "run"),
        "reward_fn": str(reward_fn),
    }


def fill(args: list[str], paths: dict[str, str]) -> list[str]:
    return [arg.format(**paths) for arg in args]


def check_ppo(args: list[str], scratch: Path, flags: list[str] = ()) -> tuple[Any, VerlKeys]:
    from verl.algos.cli import _parser
    from verl.algos.config import hydra_recipe, load_config
    from verl.algos.trainer.main import build_trainer

    parsed = _parser().parse_args(["train", *flags, *args])  # as `verl train`: Hydra's flags, then the overrides
    recipe = hydra_recipe(parsed.recipe, parsed.config_path, parsed.config_name)
    keys = VerlKeys("ppo")
    cfg = load_config(recipe, parsed.overrides, keys)
    build_trainer(cfg, data_cache=str(scratch))
    return cfg, keys


def check_sft(args: list[str], scratch: Path) -> tuple[Any, VerlKeys]:
    from verl.algos.trainer.sft_trainer import SFTTrainer

    keys = VerlKeys("sft")
    cfg = build_config(SFTConfig, overrides=args, foreign=keys)
    checked = copy.deepcopy(cfg)
    checked.trainer.default_local_dir = str(scratch)  # the data cache goes to the scratch folder
    SFTTrainer(checked, cfg.model.path).setup_data()
    return cfg, keys


def value_at(cfg: Any, key: str) -> Any:
    node = cfg
    for part in key.split("."):
        node = node[part] if isinstance(node, dict) else getattr(node, part)
    return node


def same(resolved: Any, given: Any) -> bool:
    if isinstance(resolved, list) and not isinstance(given, list):
        given = [given]
    if isinstance(resolved, float) or isinstance(given, float):
        return isinstance(given, (int, float)) and math.isclose(float(resolved), float(given), rel_tol=1e-9)
    if isinstance(resolved, list):
        return len(resolved) == len(given) and all(same(r, g) for r, g in zip(resolved, given))
    return resolved == given


def is_ours(schema: type, key: str) -> bool:
    try:
        check_key(schema, key, "test")
        return True
    except ConfigError:
        return False


def assert_values_carried(cfg: Any, keys: VerlKeys, args: list[str], schema: type) -> None:
    last: dict[str, Any] = {}
    for arg in args:
        if arg.startswith("--"):
            continue  # Hydra's flags, checked by the refusal cases
        key, value = parse_override(arg)
        if value is not DELETE:
            last[key] = value
    ignored = {key for key, _, _ in keys.no_effect}
    for key, value in last.items():
        if key == "data.train_batch_size" and value == 0:  # verl's fully async scripts: derived
            at = cfg.async_training
            assert cfg.data.train_batch_size == at.require_batches * cfg.actor_rollout_ref.actor.ppo_mini_batch_size
        elif is_ours(schema, key):
            assert same(value_at(cfg, key), value), f"{key}: resolved {value_at(cfg, key)!r}, given {value!r}"
        elif key in ignored:
            continue
        else:
            target, mapped = keys.translate(key, value, "test")  # an alias: our key holds the value
            assert same(value_at(cfg, target), mapped), f"{key} -> {target}: {value_at(cfg, target)!r} != {mapped!r}"


def test_the_table_has_a_dozen_accepted_scripts_of_each_family():
    accepted = [p.stem for p in SCRIPTS if p.stem not in REFUSED]
    assert len(accepted) >= 12
    for family in ("grpo", "ppo", "rloo", "reinforce_pp", "remax", "gspo", "cispo", "sft", "reward_model"):
        assert any(family in name for name in accepted), family


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_upstream_script_is_accepted_with_its_values(script, local_paths, tmp_path):
    entry, args = read_script(script)
    # what the entry command adds before the script's overrides (a recipe: verl's other entry points)
    flags = entry.split()[2:]
    args = fill(args, local_paths)
    check = check_sft if entry == "verl sft" else functools.partial(check_ppo, flags=flags)
    if script.stem in REFUSED:
        with pytest.raises(ConfigError, match=REFUSED[script.stem]):
            check(args, tmp_path)
        return
    cfg, keys = check(args, tmp_path)
    from verl.algos.config.schema import PPOConfig

    assert_values_carried(cfg, keys, args, SFTConfig if entry == "verl sft" else PPOConfig)
