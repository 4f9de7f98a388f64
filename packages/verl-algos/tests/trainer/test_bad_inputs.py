"""Bad inputs, one table row each: the error says what was wrong and what to do, and the last checkpoint
survives it.

- Rows that can be checked up front (config values, model folders, the tokenizer, every dataset row,
  the reward function's setup) fail in ``verl train`` before Ray starts, as a ConfigError whose message
  holds the row's key phrases, and leave the run folder's complete checkpoint as it was.
- Reward-function failures that can only appear while scoring are checked on the reward manager the
  trainer calls (fast, no Ray), and end to end on tiny real runs (save_freq=1): a run stopped by a broken
  reward keeps its last complete checkpoint, logs the error in ``train.log`` and resumes from it; a reward
  that hangs or raises on some samples costs those samples only.

The end-to-end tests come last in the file: the table asserts that Ray never started, and the module's
Ray session starts with the first end-to-end test.
"""

from __future__ import annotations

import json
import math
import shutil
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
import torch
from algos_test_helpers import closing_new_log_handlers
from verl_test_models import CHATML_TEMPLATE

from verl.algos.config import load_config
from verl.algos.rewards import (
    RewardFunctionError,
    RewardSetupError,
    build_reward_manager,
    load_custom_reward_function,
)
from verl.algos.run import checkpoint_layout as layout
from verl.algos.trainer.main import build_trainer, run, train
from verl.core.config import ConfigError
from verl.core.protocol import DataProto

TRAIN_ROWS = 8
#: Bad rows go last: a lazily validated dataset would only meet them at the last step of an epoch.
BAD_ROW = TRAIN_ROWS - 1
LONG_QUESTION = "How many apples does Tom have now? " * 30


# ------------------------------------------------------------------------------------------ data helpers
def row(i: int, **changes) -> dict:
    base = {
        "data_source": "arithmetic",
        "prompt": [{"role": "user", "content": f"What is {i}+1? Answer with a number."}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(i + 1)},
        "extra_info": {"index": i},
    }
    base.update(changes)
    return base


def rows(n: int = TRAIN_ROWS, bad: int | None = None, drop: str | None = None, **changes) -> list[dict]:
    """``n`` good rows; row ``bad`` gets ``changes`` (or loses the field ``drop``)."""
    out = [row(i) for i in range(n)]
    if bad is not None:
        out[bad] = {k: v for k, v in row(bad, **changes).items() if k != drop}
    return out


@dataclass
class Ctx:
    """What a table row may use: the tiny model, a scratch folder, and names for the message phrases."""

    model: str
    tmp: Path
    names: dict[str, str] = field(default_factory=dict)

    def fill(self, phrase: str) -> str:
        """``phrase`` with each ``{name}`` replaced by the path recorded under that name."""
        for name, value in self.names.items():
            phrase = phrase.replace("{" + name + "}", value)
        return phrase

    def jsonl(self, name: str, content: list[dict]) -> str:
        path = self.tmp / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in content))
        self.names[name] = str(path)
        return str(path)

    def model_copy(self, name: str, damage: Callable[[Path], None]) -> str:
        folder = self.tmp / name
        shutil.copytree(self.model, folder)
        damage(folder)
        self.names[name] = str(folder)
        return str(folder)

    def file(self, name: str, text: str) -> str:
        path = self.tmp / name
        path.write_text(textwrap.dedent(text))
        self.names[name.replace(".", "_")] = str(path)
        return str(path)


def halve(file: Path) -> None:
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])


def shard_index_with_missing_shard(folder: Path) -> None:
    (folder / "model.safetensors").rename(folder / "model-00001-of-00002.safetensors")
    index = {
        "metadata": {},
        "weight_map": {
            "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
            "lm_head.weight": "model-00002-of-00002.safetensors",
        },
    }
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def empty_parquet(ctx: Ctx, name: str) -> str:
    path = ctx.tmp / f"{name}.parquet"
    pq.write_table(pa.Table.from_pylist(rows(2)).slice(0, 0), path)
    ctx.names[name] = str(path)
    return str(path)


def garbage_jsonl(ctx: Ctx) -> str:
    path = ctx.tmp / "garbage.jsonl"
    path.write_text('{"data_source": "arithmetic", "prompt": [\n')  # cut off mid-row
    ctx.names["garbage"] = str(path)
    return str(path)


def train_on(path: str) -> list[str]:
    return [f"data.train_files=[{path}]"]


def val_on(path: str) -> list[str]:
    return [f"data.val_files=[{path}]"]


@dataclass
class Case:
    """One bad input: ``overrides(ctx)`` gives the command line; every phrase (each ``{name}`` filled with
    the path ``ctx.names`` records) must be in the message; ``recipe`` is the recipe argument of ``verl train``."""

    id: str
    overrides: Callable[[Ctx], list[str]]
    phrases: list[str]
    recipe: Callable[[Ctx], str | None] = lambda ctx: None


def fixed(*overrides: str) -> Callable[[Ctx], list[str]]:
    return lambda ctx: list(overrides)


# ------------------------------------------------------------------------------------------ the table
CASES = [
    # -- config values: types (the rows test_config_errors.py has are not repeated here)
    Case(
        "config: wrong type for a bool",
        fixed("actor_rollout_ref.rollout.do_sample=maybe"),
        ["bad value for 'actor_rollout_ref.rollout.do_sample'", "'maybe'", "expected bool"],
    ),
    Case(
        # one value where a list goes is a list of one (verl's "a path or a list of paths"), then checked
        "config: a number where a list of names goes",
        fixed("trainer.logger=5"),
        ["trainer.logger='5' is not valid", "choose one of: console"],
    ),
    Case(
        "config: a fraction for an integer",
        fixed("data.train_batch_size=2.5"),
        ["bad value for 'data.train_batch_size'", "2.5", "expected int"],
    ),
    Case(
        "config: a value for a whole section",
        fixed("data=5"),
        ["bad value for 'data'", "expected DataConfig"],
    ),
    # -- config values: sizes
    Case(
        "config: negative prompt length", fixed("data.max_prompt_length=-1"), ["data.max_prompt_length=-1 must be > 0"]
    ),
    Case(
        "config: negative mini-batch",
        fixed("actor_rollout_ref.actor.ppo_mini_batch_size=-2"),
        ["actor_rollout_ref.actor.ppo_mini_batch_size=-2 must be > 0"],
    ),
    Case(
        "config: zero critic mini-batch",
        fixed("critic.ppo_mini_batch_size=0"),
        ["critic.ppo_mini_batch_size=0 must be > 0"],
    ),
    Case("config: zero validation batch", fixed("data.val_batch_size=0"), ["data.val_batch_size=0 must be > 0"]),
    Case("config: zero epochs", fixed("trainer.total_epochs=0"), ["trainer.total_epochs=0 must be > 0"]),
    Case(
        "config: negative learning rate",
        fixed("actor_rollout_ref.actor.optim.lr=-1"),
        ["actor_rollout_ref.actor.optim.lr=-1.0 must be > 0"],
    ),
    Case(
        "config: zero reward timeout",
        fixed("reward_model.timeout_s=0"),
        ["reward_model.timeout_s=0", "must be positive (or None for no limit)"],
    ),
    # -- config values: unknown keys
    Case(
        "config: misspelt section",
        fixed("trainr.total_epochs=1"),
        ["unknown config key 'trainr.total_epochs' (from the command line)", "Did you mean: trainer.total_epochs"],
    ),
    Case(
        "config: unknown key in a recipe file",
        lambda ctx: [],
        [
            "unknown config key 'actor_rollout_ref.actor.optim.lrr' (from {recipe_yaml})",
            "actor_rollout_ref.actor.optim.lr",
        ],
        recipe=lambda ctx: ctx.file("recipe.yaml", "actor_rollout_ref:\n  actor:\n    optim:\n      lrr: 1.0e-5\n"),
    ),
    # -- config values: choices
    Case(
        "config: bad truncation mode",
        fixed("data.truncation=cut"),
        ["data.truncation='cut' is not valid; choose one of: error, left, right, middle"],
    ),
    Case(
        "config: bad loss aggregation",
        fixed("actor_rollout_ref.actor.loss_agg_mode=mean"),
        ["'actor_rollout_ref.actor.loss_agg_mode' (from the command line): 'mean'; expected one of: token-mean"],
    ),
    Case(
        "config: bad lr schedule",
        fixed("actor_rollout_ref.actor.optim.lr_scheduler_type=linear"),
        ["actor_rollout_ref.actor.optim.lr_scheduler_type", "'linear'; expected one of: constant, cosine"],
    ),
    Case(
        "config: bad resume mode",
        fixed("trainer.resume_mode=sometimes"),
        ["trainer.resume_mode='sometimes': use auto, disable, or a path to a global_step_N folder"],
    ),
    Case(
        "config: unknown rollout backend",
        fixed("actor_rollout_ref.rollout.name=vllmm"),
        [
            "actor_rollout_ref.rollout.name: no rollout engine registered for (backend='vllmm'",
            "Nearest: (backend='vllm'",
        ],
    ),
    Case(
        "config: unknown reward manager",
        fixed("reward_model.reward_manager=naiv"),
        ["reward_model.reward_manager", "'naiv'", "naive"],
    ),
    # -- config values: combinations
    Case(
        "config: mini-batch larger than the batch",
        fixed("data.train_batch_size=2", "actor_rollout_ref.actor.ppo_mini_batch_size=4"),
        [
            "actor_rollout_ref.actor.ppo_mini_batch_size=4 is larger than data.train_batch_size=2",
            "lower actor_rollout_ref.actor.ppo_mini_batch_size or raise data.train_batch_size",
        ],
    ),
    Case(
        "config: grpo with one response per prompt",
        fixed("algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=1"),
        [
            "algorithm.adv_estimator=grpo compares the responses of each prompt",
            "actor_rollout_ref.rollout.n=1 gives one response per prompt",
            "Set actor_rollout_ref.rollout.n to 2 or more",
        ],
    ),
    Case(
        "config: rloo with one response per prompt",
        fixed("algorithm.adv_estimator=rloo", "actor_rollout_ref.rollout.n=1"),
        ["algorithm.adv_estimator=rloo", "actor_rollout_ref.rollout.n=1"],
    ),
    Case(
        "config: batch larger than the training set",
        fixed("data.train_batch_size=16", "actor_rollout_ref.actor.ppo_mini_batch_size=2"),
        [f"the training set has {TRAIN_ROWS} prompts, fewer than data.train_batch_size=16", "lower the batch size"],
    ),
    Case(
        "config: reward model on without a model",
        fixed("reward_model.enable=true"),
        ["reward_model.enable=true needs reward_model.model.path"],
    ),
    # -- model folders
    Case(
        "model: missing folder",
        lambda ctx: [f"actor_rollout_ref.model.path={ctx.tmp / 'absent'}"],
        ["actor_rollout_ref.model.path", "absent' is neither a local folder nor a built-in model", "built-in models:"],
    ),
    Case(
        "model: folder without config.json",
        lambda ctx: [
            f"actor_rollout_ref.model.path={ctx.model_copy('noconfig', lambda f: (f / 'config.json').unlink())}"
        ],
        ["actor_rollout_ref.model.path: {noconfig} has no config.json", "give the folder that save_pretrained wrote"],
    ),
    Case(
        "model: config.json is garbage",
        lambda ctx: [
            f"actor_rollout_ref.model.path={ctx.model_copy('badconfig', lambda f: (f / 'config.json').write_text('{oops'))}"
        ],
        ["{badconfig}/config.json is not valid JSON", "copy the model folder again"],
    ),
    Case(
        "model: config but no weights",
        lambda ctx: [
            f"actor_rollout_ref.model.path={ctx.model_copy('noweights', lambda f: (f / 'model.safetensors').unlink())}"
        ],
        ["{noweights} has config.json but no weights", "model.safetensors", "the folder is incomplete"],
    ),
    Case(
        "model: weights file truncated",
        lambda ctx: [
            f"actor_rollout_ref.model.path={ctx.model_copy('halfweights', lambda f: halve(f / 'model.safetensors'))}"
        ],
        ["{halfweights}/model.safetensors is truncated", "but its header describes", "copy the model folder again"],
    ),
    Case(
        "model: weights file is garbage",
        lambda ctx: [
            "actor_rollout_ref.model.path="
            + ctx.model_copy("junkweights", lambda f: (f / "model.safetensors").write_bytes(b"not a model " * 50))
        ],
        ["{junkweights}/model.safetensors is not a valid safetensors file", "truncated or corrupt"],
    ),
    Case(
        "model: a shard of the index is missing",
        lambda ctx: [f"actor_rollout_ref.model.path={ctx.model_copy('sharded', shard_index_with_missing_shard)}"],
        ["{sharded}: model.safetensors.index.json lists weight shard(s) that are missing", "model-00002-of-00002"],
    ),
    Case(
        "model: no tokenizer files",
        lambda ctx: [
            "actor_rollout_ref.model.path="
            + ctx.model_copy(
                "notokenizer", lambda f: [(f / name).unlink() for name in ("tokenizer.json", "tokenizer_config.json")]
            )
        ],
        ["{notokenizer} has no tokenizer files", "set actor_rollout_ref.model.tokenizer_path"],
    ),
    Case(
        "model: corrupt reward model folder",
        lambda ctx: [
            "reward_model.enable=true",
            f"reward_model.model.path={ctx.model_copy('badrm', lambda f: (f / 'config.json').write_text('[]'))}",
        ],
        ["reward_model.model.path: {badrm}/config.json holds a JSON list"],
    ),
    # -- the tokenizer's chat template
    Case(
        "tokenizer: no chat template for chat prompts",
        lambda ctx: [
            "actor_rollout_ref.model.path="
            + ctx.model_copy("notemplate", lambda f: (f / "chat_template.jinja").unlink())
        ],
        [
            "has no chat template",
            "actor_rollout_ref.model.custom_chat_template=",
            "actor_rollout_ref.model.tokenizer_path",
            "data.plain_prompt_fallback=true",
        ],
    ),
    Case(
        "tokenizer: a custom chat template that does not render",
        fixed("actor_rollout_ref.model.custom_chat_template={% for m in messages %}{{ m.content }"),
        ["actor_rollout_ref.model.custom_chat_template does not render a conversation"],
    ),
    # -- dataset rows (the bad row is the last one: all rows are validated before Ray starts)
    Case(
        "data: no prompt column",
        lambda ctx: train_on(ctx.jsonl("noprompt", [{k: v for k, v in r.items() if k != "prompt"} for r in rows()])),
        ["data.train_files: {noprompt}, row 0: missing column(s) ['prompt']", "data.prompt_key"],
    ),
    Case(
        "data: a row without its prompt",
        lambda ctx: train_on(ctx.jsonl("rowprompt", rows(bad=BAD_ROW, drop="prompt"))),
        [f"{{rowprompt}}, row {BAD_ROW}: column 'prompt' is missing (null)", "expected a list of chat messages"],
    ),
    Case(
        "data: prompt is an int",
        lambda ctx: train_on(ctx.jsonl("intprompt", rows(bad=BAD_ROW, prompt=7))),
        [f"{{intprompt}}, row {BAD_ROW}: column 'prompt' is 7 (type int)", "expected a list of chat messages"],
    ),
    Case(
        "data: prompt is one message dict, not a list",
        lambda ctx: train_on(ctx.jsonl("dictprompt", rows(bad=BAD_ROW, prompt={"role": "user", "content": "1+1?"}))),
        [f"{{dictprompt}}, row {BAD_ROW}: column 'prompt' is a single dict", "wrap it in a list"],
    ),
    Case(
        "data: prompt is a plain string",
        lambda ctx: train_on(ctx.jsonl("strprompt", rows(bad=BAD_ROW, prompt="What is 2+2?"))),
        [f"{{strprompt}}, row {BAD_ROW}: column 'prompt' is a string", "[{'role': 'user', 'content': <the text>}]"],
    ),
    Case(
        "data: reward_model without ground_truth",
        lambda ctx: train_on(ctx.jsonl("nogt", rows(bad=BAD_ROW, reward_model={"style": "rule"}))),
        [f"{{nogt}}, row {BAD_ROW}: column 'reward_model' has no 'ground_truth'", "reference answer"],
    ),
    Case(
        "data: a row without reward_model",
        lambda ctx: train_on(ctx.jsonl("norm", rows(bad=BAD_ROW, drop="reward_model"))),
        [f"{{norm}}, row {BAD_ROW}: column 'reward_model' is None", "'ground_truth'"],
    ),
    Case(
        "data: ground_truth of the wrong type",
        lambda ctx: train_on(
            ctx.jsonl("dictgt", rows(bad=BAD_ROW, reward_model={"style": "rule", "ground_truth": {"answer": 8}}))
        ),
        [
            f"data.train_files: {{dictgt}}, row {BAD_ROW}: data_source 'arithmetic': reward_model.ground_truth is "
            "{'answer': 8} (type dict)",
            "compares the answer with a string or a number",
            "custom_reward_function.path",
        ],
    ),
    Case(
        "data: ground_truth not a number for a numeric task",
        lambda ctx: train_on(
            ctx.jsonl("wordgt", rows(bad=BAD_ROW, reward_model={"style": "rule", "ground_truth": "eight"}))
        ),
        [
            f"{{wordgt}}, row {BAD_ROW}: data_source 'arithmetic': reward_model.ground_truth: numeric reward: "
            "ground truth 'eight' is not a number"
        ],
    ),
    Case(
        "data: data_source without a built-in reward",
        lambda ctx: train_on(ctx.jsonl("mysource", rows(bad=BAD_ROW, data_source="my/task"))),
        [
            f"{{mysource}}, row {BAD_ROW}: data_source 'my/task' has no built-in reward function",
            "set custom_reward_function.path",
        ],
    ),
    Case(
        "data: validation row of the wrong type",
        lambda ctx: val_on(ctx.jsonl("badval", rows(4, bad=3, prompt=3))),
        ["data.val_files: {badval}, row 3: column 'prompt' is 3 (type int)"],
    ),
    Case(
        "data: unreadable file",
        lambda ctx: train_on(garbage_jsonl(ctx)),
        ["data.train_files: {garbage}: could not be read as json", "JSON parse error"],
    ),
    # -- prompts over data.max_prompt_length
    Case(
        "data: prompt over the limit, truncation=error",
        lambda ctx: [
            *train_on(ctx.jsonl("long", rows(bad=BAD_ROW, prompt=[{"role": "user", "content": LONG_QUESTION}]))),
            "data.max_prompt_length=64",
            "data.filter_overlong_prompts=false",
            "data.truncation=error",
        ],
        [
            f"{{long}}, row {BAD_ROW}: the prompt has ",
            "tokens, more than data.max_prompt_length=64",
            "data.filter_overlong_prompts=true",
            "data.truncation=left|right|middle",
            "raise data.max_prompt_length",
        ],
    ),
    Case(
        "data: every prompt over the limit, filtering on",
        lambda ctx: [
            *train_on(
                ctx.jsonl("alllong", [row(i, prompt=[{"role": "user", "content": LONG_QUESTION}]) for i in range(4)])
            ),
            "data.max_prompt_length=64",
            "data.filter_overlong_prompts=true",
        ],
        [
            "data.train_files: {alllong}: empty after filtering",
            "all 4 prompts are longer than data.max_prompt_length=64 tokens",
            "Raise data.max_prompt_length to at least",
        ],
    ),
    Case(
        "data: every validation prompt over the limit",
        lambda ctx: [
            *val_on(
                ctx.jsonl("longval", [row(i, prompt=[{"role": "user", "content": LONG_QUESTION}]) for i in range(4)])
            ),
            "data.max_prompt_length=64",
        ],
        ["data.val_files: {longval}: empty after filtering"],
    ),
    # -- empty datasets
    Case(
        "data: empty training file",
        lambda ctx: train_on(ctx.jsonl("emptytrain", [])),
        ["data.train_files: {emptytrain}: the file is empty (0 bytes); it must hold at least one row"],
    ),
    Case(
        "data: validation file with no rows",
        lambda ctx: val_on(empty_parquet(ctx, "emptyval")),
        ["data.val_files: {emptyval}: the file has no rows"],
    ),
    # -- the reward function's setup
    Case(
        "reward: custom reward file missing",
        lambda ctx: [f"custom_reward_function.path={ctx.tmp / 'absent_reward.py'}"],
        ["custom_reward_function.path=", "absent_reward.py does not exist", "give the path of a Python file"],
    ),
    Case(
        "reward: custom reward with the wrong parameters",
        lambda ctx: [
            "custom_reward_function.path="
            + ctx.file("two_args.py", "def compute_score(solution, answer):\n    return 1.0\n")
        ],
        ["reward function compute_score from {two_args_py}", "cannot be called with the keywords", "solution_str"],
    ),
]


# ------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module", autouse=True)
def drop_run_log_handlers():
    with closing_new_log_handlers():
        yield


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory) -> Path:
    """A run folder holding a complete checkpoint (step 2), as a user's run has when they fix a setting and
    start again: no bad input may touch it."""
    root = tmp_path_factory.mktemp("run")
    step = layout.prepare_step_dir(root, 2)
    (step / "actor").mkdir()
    (step / "actor" / "model.pt").write_bytes(b"weights of step 2")
    layout.mark_complete(root, 2, {"global_step": 2, "batch_order": {"epoch": 0, "batch_in_epoch": 2}})
    return root


def snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "global_step" in str(p)
    }


def good_overrides(ctx: Ctx, out: Path) -> list[str]:
    return [
        f"actor_rollout_ref.model.path={ctx.model}",
        f"trainer.default_local_dir={out}",
        f"data.train_files=[{ctx.jsonl('train', rows())}]",
        f"data.val_files=[{ctx.jsonl('val', rows(4))}]",
        "data.train_batch_size=2",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "trainer.logger=[file]",
    ]


# ------------------------------------------------------------------------------------------ the tests
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_fails_before_ray_with_a_clear_message_and_keeps_the_checkpoint(
    case: Case, tiny_model_dir, run_folder, tmp_path
):
    ctx = Ctx(tiny_model_dir, tmp_path)
    before = snapshot(run_folder)
    overrides = [*good_overrides(ctx, run_folder), *case.overrides(ctx)]
    with pytest.raises(ConfigError) as err:
        train(case.recipe(ctx), overrides)
    message = str(err.value)
    for phrase in case.phrases:
        expected = ctx.fill(phrase)
        assert expected in message, f"{expected!r} not in the message:\n{message}"
    assert not ray.is_initialized(), "a bad input must be reported before Ray starts"
    assert layout.latest_complete(run_folder) == layout.step_dir(run_folder, 2)
    assert snapshot(run_folder) == before, "the last checkpoint must be left untouched"


def test_the_fixes_the_chat_template_message_names_work(tiny_model_dir, tmp_path):
    """Both ways out of 'no chat template' give a run that builds: a template file, or raw text prompts."""
    ctx = Ctx(tiny_model_dir, tmp_path)
    model = ctx.model_copy("notemplate", lambda f: (f / "chat_template.jinja").unlink())
    template = ctx.file("chatml.jinja", CHATML_TEMPLATE)
    base = [*good_overrides(ctx, tmp_path / "out"), f"actor_rollout_ref.model.path={model}"]

    templated = build_trainer(load_config(None, [*base, f"actor_rollout_ref.model.custom_chat_template={template}"]))
    text = templated.tokenizer.decode(templated.train_dataset[0]["raw_prompt_ids"])
    assert text.startswith("<|im_start|>user\nWhat is 0+1?") and text.endswith("<|im_start|>assistant\n")

    plain = build_trainer(load_config(None, [*base, "data.plain_prompt_fallback=true"]))
    assert plain.tokenizer.decode(plain.train_dataset[0]["raw_prompt_ids"]) == "What is 0+1? Answer with a number."
    assert not ray.is_initialized()


# -- reward functions while scoring, on the manager the trainer calls (a real tokenizer, no Ray)
def scored_batch(tokenizer, responses: list[str], data_source: str = "arithmetic") -> DataProto:
    width = 16
    ids = [tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for text in responses]
    padded = [row_ids + [tokenizer.pad_token_id] * (width - len(row_ids)) for row_ids in ids]
    mask = [[1] * len(row_ids) + [0] * (width - len(row_ids)) for row_ids in ids]
    n = len(responses)
    return DataProto.from_dict(
        {"responses": torch.tensor(padded), "response_mask": torch.tensor(mask)},
        {
            "data_source": np.array([data_source] * n, dtype=object),
            "reward_model": np.array([{"ground_truth": "2"}] * n, dtype=object),
            "extra_info": np.array([{"index": i} for i in range(n)], dtype=object),
        },
    )


def load_reward(tmp_path: Path, body: str, params: str = "data_source, solution_str, ground_truth, extra_info=None"):
    """The user's file ``reward.py`` defining ``compute_score(params)`` with ``body``, loaded as verl does."""
    path = tmp_path / "reward.py"
    path.write_text(
        f"import math, time\n\ndef compute_score({params}):\n" + textwrap.indent(textwrap.dedent(body), "    ")
    )
    return load_custom_reward_function(str(path)), str(path)


@pytest.mark.parametrize(
    "returns, shown",
    [
        ("'right'", "returned 'right' (type str)"),
        ("None", "returned None (type NoneType) (a function that ends without a return statement returns None)"),
        ("math.nan", "returned NaN; scores must be finite numbers"),
        ("math.inf", "returned inf; scores must be finite numbers"),
        ("{'acc': 1.0}", "returned a dict without a 'score' key"),
    ],
)
def test_a_reward_that_returns_a_non_number_stops_with_the_function_and_the_value(tokenizer, tmp_path, returns, shown):
    fn, path = load_reward(tmp_path, f"return {returns}\n")
    manager = build_reward_manager("naive", tokenizer, compute_score=fn)
    with pytest.raises(RewardSetupError) as err:
        manager(scored_batch(tokenizer, ["1+1=2", "2"]))
    assert f"reward function compute_score from {path} {shown}" in str(err.value)


@pytest.mark.parametrize("manager_name", ["naive", "batch", "dapo"])
def test_a_reward_that_raises_on_every_sample_stops_naming_function_source_and_error(tokenizer, tmp_path, manager_name):
    batched = "data_sources, solution_strs, ground_truths, extra_infos"
    params = batched if manager_name == "batch" else "data_source, solution_str, ground_truth, extra_info=None"
    fn, path = load_reward(tmp_path, "raise KeyError('answer_field')\n", params)
    manager = build_reward_manager(manager_name, tokenizer, compute_score=fn)
    with pytest.raises(RewardFunctionError) as err:
        manager(scored_batch(tokenizer, ["1+1=2", "2", "3"], data_source="my/task"))
    message = str(err.value)
    assert f"reward function compute_score from {path} raised on all 3 samples of the batch" in message
    assert "data_source='my/task'" in message and "KeyError: 'answer_field'" in message
    assert "resumes from the last complete checkpoint" in message
    assert isinstance(err.value.__cause__, KeyError), "the function's own traceback is chained"


def test_a_reward_that_hangs_on_every_sample_stops_and_names_the_timeout(tokenizer, tmp_path):
    fn, path = load_reward(tmp_path, "time.sleep(1.0)\nreturn 1.0\n")
    manager = build_reward_manager("naive", tokenizer, compute_score=fn, timeout_s=0.1)
    with pytest.raises(RewardFunctionError) as err:
        manager(scored_batch(tokenizer, ["2", "3"]))
    message = str(err.value)
    assert f"compute_score from {path} ran past reward_model.timeout_s on all 2 samples" in message
    assert "RewardTimeout" in message and "raise reward_model.timeout_s" in message


# -- end to end: failures mid-run (real Ray, FSDP2 on gloo, the HF rollout; one worker, 2 samples a step)
REWARD_SOURCE = """
import math
import time

calls = 0


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    global calls
    calls += 1
    {failure}
    return float(len(solution_str) % 3) / 2.0
"""

SAMPLES_PER_STEP = 4  # data.train_batch_size=2 prompts x rollout.n=2


def write_reward(folder: Path, name: str, failure: str = "pass") -> str:
    path = folder / f"{name}.py"
    path.write_text(REWARD_SOURCE.format(failure=failure))
    return str(path)


def e2e_config(ctx: Ctx, out: Path, reward: str, steps: int, *extra: str):
    return load_config(
        "grpo",
        [
            *good_overrides(ctx, out),
            f"custom_reward_function.path={reward}",
            "trainer.n_gpus_per_node=1",
            f"trainer.total_training_steps={steps}",
            "trainer.save_freq=1",
            "trainer.test_freq=-1",
            "trainer.val_before_train=false",
            "trainer.plot_curves=false",
            "data.max_response_length=4",
            *extra,
        ],
    )


def test_a_reward_that_breaks_mid_run_keeps_the_last_checkpoint_logs_the_error_and_resumes(
    ray_session, tiny_model_dir, tmp_path
):
    """Steps 1-2 train and checkpoint; at step 3 the reward raises on every sample and the run stops.
    Started again with a fixed reward (one that still hangs on one sample and raises on another), the
    run resumes from step 2 and finishes, those two samples scoring 0 and counted."""
    ctx = Ctx(tiny_model_dir, tmp_path)
    out = tmp_path / "run"
    broken = write_reward(
        tmp_path, "broken", f"if calls > {2 * SAMPLES_PER_STEP}:\n        raise RuntimeError('grader bug')"
    )
    with pytest.raises(RewardFunctionError) as err:
        run(e2e_config(ctx, out, broken, 4))
    phrases = [
        f"reward function compute_score from {broken} raised on all {SAMPLES_PER_STEP} samples of the batch",
        "data_source='arithmetic'",
        "RuntimeError: grader bug",
    ]
    assert all(phrase in str(err.value) for phrase in phrases)
    assert layout.latest_complete(out) == layout.step_dir(out, 2), "the last complete checkpoint is kept"
    assert not layout.is_complete(layout.step_dir(out, 3))
    log = (out / "train.log").read_text()
    assert "the run stopped on an error; the last complete checkpoint and the logs" in log
    assert all(phrase in log for phrase in phrases), "train.log holds the error"

    # The fixed reward still hangs on its 2nd call and raises on its 6th: each costs one sample only.
    fixed_reward = write_reward(
        tmp_path,
        "fixed",
        "if calls == 2:\n        time.sleep(1.5)\n    if calls == 6:\n        raise ValueError('cannot parse')",
    )
    summary = run(e2e_config(ctx, out, fixed_reward, 4, "reward_model.timeout_s=0.5"))
    assert summary["steps"] == 4
    # Resumed, not restarted: the second run logged only the steps after the kept checkpoint.
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    step3, step4 = records[2], records[3]
    assert step3["reward/timeouts"] == 1.0 and step3["reward/errors"] == 1.0
    assert step4["reward/timeouts"] == 0.0 and step4["reward/errors"] == 1.0
    assert all(math.isfinite(r["actor/pg_loss"]) for r in (step3, step4))
    assert layout.latest_complete(out) == layout.step_dir(out, 4)
    assert f"reward function compute_score from {fixed_reward} raised on row" in (out / "train.log").read_text()
