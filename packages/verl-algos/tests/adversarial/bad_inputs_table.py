"""The adversarial table: what a careless (or unlucky) user tries, and what must happen.

Every case runs the ``verl`` command a user would type, in-process (``verl config show``, ``verl train``
and ``verl export`` all stop before Ray starts), in a scratch folder that holds a run folder with a complete
checkpoint, metrics and a file of the user's (``ctx.run``). For every case:

- the exit status is non-zero (``exit``: the exact status, where it matters);
- stderr's first ``verl:`` line is the message, holding each phrase of ``message``; stderr has no traceback;
- Ray never started;
- every file that existed before (the checkpoint, metrics, the user's files, other runs) is unchanged, and
  nothing was deleted. (A ``verl train`` that got as far as its run folder may append its error to
  ``train.log``: that is where the traceback goes.)

Rows the schema alone refuses (types, unknown keys, choices) are in ``trainer/test_config_errors.py`` and
``trainer/test_bad_inputs.py``; model-folder, dataset and reward-setup rows in ``trainer/test_bad_inputs.py``.
The cases that need a real run on the tiny model (two runs at once, Ctrl-C, a reward that exits mid-run,
weights that overflow, a full disk) are ``RUN_CASES``, run by ``test_bad_inputs_table.py``.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

TRAIN_ROWS = 8


@dataclass
class Ctx:
    """A case's world: the tiny model, a scratch folder, a run folder with a complete checkpoint."""

    model: str
    tmp: Path
    run: Path
    checkpoint: Path
    names: dict[str, str] = field(default_factory=dict)
    #: Processes a case started (a process holding a lock); the runner kills them afterwards.
    processes: list = field(default_factory=list)

    def fill(self, text: str) -> str:
        names = {"tmp": str(self.tmp), "run": str(self.run), "checkpoint": str(self.checkpoint), **self.names}
        for name, value in names.items():
            text = text.replace("{" + name + "}", value)
        return text

    def file(self, name: str, text: str) -> str:
        path = self.tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return str(path)

    def model_with_config(self, name: str, **changes) -> str:
        """A copy of the tiny model whose config.json has ``changes``."""
        import shutil

        folder = self.tmp / name
        shutil.copytree(self.model, folder)
        config = json.loads((folder / "config.json").read_text())
        config.update(changes)
        (folder / "config.json").write_text(json.dumps(config))
        return str(folder)


@dataclass
class Case:
    id: str
    #: What the user tries, in words.
    tried: str
    #: The ``verl`` command line (without ``verl``); ``{run}``, ``{tmp}``, ``{checkpoint}`` filled in.
    argv: Callable[[Ctx], list[str]]
    #: Phrases of the one-line message (filled in as argv).
    message: list[str]
    #: The exact exit status (None: any non-zero).
    exit: int | None = None
    #: Whether nothing at all may be written into the run folder (not even train.log).
    untouched: bool = True


def rows(n: int, **changes) -> list[dict]:
    return [
        {
            "data_source": "arithmetic",
            "prompt": [{"role": "user", "content": f"What is {i}+1? Answer with a number."}],
            "reward_model": {"style": "rule", "ground_truth": str(i + 1)},
            "extra_info": {"index": i},
            **changes,
        }
        for i in range(n)
    ]


def data_files(ctx: Ctx) -> list[str]:
    train, val = ctx.tmp / "data" / "train set.jsonl", ctx.tmp / "data" / "val set.jsonl"
    if not train.exists():
        train.parent.mkdir(parents=True, exist_ok=True)
        train.write_text("".join(json.dumps(r) + "\n" for r in rows(TRAIN_ROWS)))
        val.write_text("".join(json.dumps(r) + "\n" for r in rows(4)))
    return [f"data.train_files=[{train}]", f"data.val_files=[{val}]"]


def good(ctx: Ctx) -> list[str]:
    """A valid small config (the tiny model, jsonl data) whose run folder is ``ctx.run``."""
    return [
        f"actor_rollout_ref.model.path={ctx.model}",
        f"trainer.default_local_dir={ctx.run}",
        *data_files(ctx),
        "data.train_batch_size=2",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "trainer.logger=[file]",
    ]


def sft_good(ctx: Ctx) -> list[str]:
    """A valid small ``verl sft`` config: rows whose response is extra_info.solution, run folder ``ctx.run``."""
    path = ctx.tmp / "data" / "sft set.jsonl"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        sft_rows = [{**r, "extra_info": {"index": i, "solution": str(i + 1)}} for i, r in enumerate(rows(TRAIN_ROWS))]
        path.write_text("".join(json.dumps(r) + "\n" for r in sft_rows))
    return [
        f"model.path={ctx.model}",
        f"trainer.default_local_dir={ctx.run}",
        f"data.train_files=[{path}]",
        f"data.val_files=[{path}]",
        "data.train_batch_size=2",
        "data.micro_batch_size_per_gpu=2",
        "trainer.logger=[file]",
    ]


def sft(*overrides: str, setup: Callable[[Ctx], list[str]] | None = None) -> Callable[[Ctx], list[str]]:
    """``verl sft`` with ``overrides`` (after ``setup``'s)."""
    return lambda ctx: ["sft", *sft_good(ctx), *(setup(ctx) if setup else []), *(ctx.fill(o) for o in overrides)]


def sft_rows_without_last_response(ctx: Ctx) -> list[str]:
    path = ctx.tmp / "data" / "last row broken.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    sft_rows = [{**r, "extra_info": {"index": i, "solution": str(i + 1)}} for i, r in enumerate(rows(TRAIN_ROWS))]
    sft_rows[-1]["extra_info"].pop("solution")
    path.write_text("".join(json.dumps(r) + "\n" for r in sft_rows))
    return [f"data.train_files=[{path}]"]


def show(*overrides: str) -> Callable[[Ctx], list[str]]:
    return lambda ctx: ["config", "show", *good(ctx), *(ctx.fill(o) for o in overrides)]


def train(*overrides: str, setup: Callable[[Ctx], list[str]] | None = None) -> Callable[[Ctx], list[str]]:
    """``verl train`` with ``overrides``; ``setup(ctx)`` prepares the scene and returns more overrides."""
    return lambda ctx: ["train", *good(ctx), *(setup(ctx) if setup else []), *(ctx.fill(o) for o in overrides)]


def export(*args: str) -> Callable[[Ctx], list[str]]:
    return lambda ctx: ["export", *(ctx.fill(a) for a in args)]


def reward_module(body: str) -> Callable[[Ctx], list[str]]:
    """A reward file whose import runs ``body`` before defining compute_score."""

    def setup(ctx: Ctx) -> list[str]:
        path = ctx.file(
            "my rewards/reward.py",
            f"{body}\n\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n",
        )
        ctx.names["reward"] = path
        return [f"custom_reward_function.path={path}"]

    return setup


def locked_by_another_process(ctx: Ctx) -> list[str]:
    """Another live process holds the run folder (a run started in another terminal)."""
    import subprocess

    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nfrom verl.algos.run import folder_lock as run_folder_lock\n"
            "lock = run_folder_lock.acquire(sys.argv[1])\nprint('locked', flush=True)\ntime.sleep(600)\n",
            str(ctx.run),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    ctx.processes.append(holder)
    assert holder.stdout.readline().strip() == "locked"
    ctx.names["holder_pid"] = str(holder.pid)
    return []


def in_another_run_folder(ctx: Ctx) -> list[str]:
    """A second run folder with its own checkpoint, for runs resumed across folders."""
    from verl.algos.run import checkpoint_layout as layout

    other = ctx.tmp / "other run"
    folder = layout.prepare_step_dir(other, 1, "other-lineage")
    (folder / "actor").mkdir()
    (folder / "actor" / "weights.bin").write_bytes(b"other weights")
    layout.mark_complete(other, 1, {"global_step": 1}, "other-lineage")
    ctx.names["other"] = str(folder)
    return []


def stray_step_folder(ctx: Ctx) -> list[str]:
    """The user keeps their own folder named like a checkpoint in the run folder."""
    mine = ctx.run / "global_step_7"
    mine.mkdir()
    (mine / "my_notes.md").write_text("hand-picked weights go here")
    return []


def damage_checkpoint(ctx: Ctx) -> list[str]:
    weights = ctx.checkpoint / "actor" / "weights.bin"
    weights.write_bytes(b"X" + weights.read_bytes()[1:])
    return []


def read_only_run_folder(ctx: Ctx) -> list[str]:
    """A run folder on a read-only mount (root ignores file modes, so a mode alone would not do)."""
    import subprocess

    target = ctx.tmp / "read-only"
    target.mkdir()
    made = subprocess.run(["mount", "--bind", "-o", "ro", str(ctx.run), str(target)], capture_output=True)
    if made.returncode != 0:
        if os.geteuid() == 0:
            raise RuntimeError(f"cannot bind-mount read-only: {made.stderr!r}")
        os.chmod(ctx.run, 0o555)  # an unprivileged user: the mode is enough
        ctx.names["read_only"] = str(ctx.run)
        return []
    subprocess.run(["mount", "-o", "remount,bind,ro", str(target)], check=False)
    ctx.names["read_only"] = str(target)
    ctx.processes.append(("umount", str(target)))
    return [f"trainer.default_local_dir={target}"]


def hide_package(name: str) -> Callable[[Ctx], list[str]]:
    def setup(ctx: Ctx) -> list[str]:
        ctx.processes.append(("unhide", name, sys.modules.get(name)))
        sys.modules[name] = None  # import raises ModuleNotFoundError, as for a package that is not installed
        return [f"trainer.logger=[file,{name}]"]

    return setup


CASES = [
    # ---- numbers that cannot train (refused by `verl config show`, so by `verl train` too)
    Case(
        "lr NaN",
        "a NaN learning rate",
        show("actor_rollout_ref.actor.optim.lr=nan"),
        ["actor_rollout_ref.actor.optim.lr=nan must be > 0 and finite"],
        exit=2,
    ),
    Case(
        "lr inf",
        "an infinite learning rate",
        show("actor_rollout_ref.actor.optim.lr=inf"),
        ["actor_rollout_ref.actor.optim.lr=inf must be > 0 and finite"],
        exit=2,
    ),
    Case(
        "lr zero",
        "a zero learning rate (trains nothing)",
        show("actor_rollout_ref.actor.optim.lr=0"),
        ["actor_rollout_ref.actor.optim.lr=0", "must be > 0"],
        exit=2,
    ),
    Case(
        "critic lr negative",
        "a negative critic learning rate",
        show("algorithm.adv_estimator=gae", "critic.optim.lr=-1e-5"),
        ["critic.optim.lr=-1e-05 must be > 0"],
        exit=2,
    ),
    Case(
        "lr as text",
        "a learning rate typed as words",
        show("actor_rollout_ref.actor.optim.lr=fast"),
        ["actor_rollout_ref.actor.optim.lr", "'fast'", "expected float"],
        exit=2,
    ),
    Case(
        "micro batch zero",
        "a zero micro-batch",
        show("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=0"),
        ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=0 must be > 0"],
        exit=2,
    ),
    Case(
        "log-prob micro batch zero",
        "a zero micro-batch for the log-prob pass",
        show("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=0"),
        ["actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=0 must be > 0"],
        exit=2,
    ),
    Case(
        "ref micro batch negative",
        "a negative reference micro-batch",
        show("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=-4"),
        ["actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=-4 must be > 0"],
        exit=2,
    ),
    Case(
        "critic micro batch zero",
        "a zero critic micro-batch",
        show("critic.ppo_micro_batch_size_per_gpu=0"),
        ["critic.ppo_micro_batch_size_per_gpu=0 must be > 0"],
        exit=2,
    ),
    Case(
        "ppo epochs zero",
        "zero PPO epochs (no update)",
        show("actor_rollout_ref.actor.ppo_epochs=0"),
        ["actor_rollout_ref.actor.ppo_epochs=0 must be > 0"],
        exit=2,
    ),
    Case(
        "top_p above 1",
        "top_p above 1",
        show("actor_rollout_ref.rollout.top_p=1.5"),
        ["actor_rollout_ref.rollout.top_p=1.5 must be in (0.0, 1.0]"],
        exit=2,
    ),
    Case(
        "top_p zero",
        "top_p 0 (no token left to sample)",
        show("actor_rollout_ref.rollout.top_p=0"),
        ["actor_rollout_ref.rollout.top_p=0", "must be in (0.0, 1.0]"],
        exit=2,
    ),
    Case(
        "validation top_p",
        "top_p 2 for validation",
        show("actor_rollout_ref.rollout.val_kwargs.top_p=2"),
        ["actor_rollout_ref.rollout.val_kwargs.top_p=2", "must be in (0.0, 1.0]"],
        exit=2,
    ),
    Case(
        "top_k below -1",
        "top_k -5",
        show("actor_rollout_ref.rollout.top_k=-5"),
        ["actor_rollout_ref.rollout.top_k=-5 has no meaning", "-1 (or 0) for no top-k filtering"],
        exit=2,
    ),
    Case(
        "temperature NaN",
        "a NaN sampling temperature",
        show("actor_rollout_ref.rollout.temperature=nan"),
        ["actor_rollout_ref.rollout.temperature=nan must be > 0 and finite"],
        exit=2,
    ),
    Case(
        "zero training steps",
        "total_training_steps=0 (a run that trains nothing)",
        show("trainer.total_training_steps=0"),
        ["trainer.total_training_steps=0 must be > 0"],
        exit=2,
    ),
    Case(
        "negative training steps",
        "total_training_steps=-3",
        show("trainer.total_training_steps=-3"),
        ["trainer.total_training_steps=-3 must be > 0"],
        exit=2,
    ),
    Case(
        "save_freq below -1",
        "save_freq=-7",
        show("trainer.save_freq=-7"),
        ["trainer.save_freq=-7 has no meaning", "or -1 for never"],
        exit=2,
    ),
    Case(
        "test_freq below -1",
        "test_freq=-2",
        show("trainer.test_freq=-2"),
        ["trainer.test_freq=-2 has no meaning"],
        exit=2,
    ),
    Case(
        "negative checkpoints to keep",
        "max_actor_ckpt_to_keep=-1",
        show("trainer.max_actor_ckpt_to_keep=-1"),
        ["trainer.max_actor_ckpt_to_keep=-1 must be >= 0"],
        exit=2,
    ),
    Case(
        "gamma above 1",
        "a discount above 1",
        show("algorithm.gamma=1.5"),
        ["algorithm.gamma=1.5 must be in [0.0, 1.0]"],
        exit=2,
    ),
    Case(
        "kl horizon zero",
        "an adaptive KL horizon of 0",
        show("algorithm.kl_ctrl.horizon=0"),
        ["algorithm.kl_ctrl.horizon=0 must be > 0"],
        exit=2,
    ),
    Case(
        "token budget shorter than a sequence",
        "ppo_max_token_len_per_gpu below prompt + response length",
        show("actor_rollout_ref.actor.ppo_max_token_len_per_gpu=100", "data.max_prompt_length=128"),
        [
            "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=100 is shorter than one sequence",
            "128 + 24 = 152 tokens",
            "to at least 152",
        ],
        exit=2,
    ),
    Case(
        "log-prob token budget shorter than a sequence",
        "a log-prob token budget below one sequence",
        show("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=64"),
        ["actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=64 is shorter than one sequence"],
        exit=2,
    ),
    # ---- surroundings that need no worker
    Case(
        "logger not installed",
        "trainer.logger=[wandb] without wandb installed",
        lambda ctx: ["config", "show", *good(ctx), *hide_package("wandb")(ctx)],
        ["trainer.logger includes 'wandb', but its package cannot be imported", "verl-algos[wandb]"],
        exit=2,
    ),
    Case(
        "unknown model type",
        "a model folder whose config.json names a model type transformers does not know",
        lambda ctx: [
            "config",
            "show",
            *good(ctx),
            f"actor_rollout_ref.model.path={ctx.model_with_config('typo model', model_type='qwen22')}",
        ],
        ["actor_rollout_ref.model.path:", "config.json has model_type 'qwen22'", "nearest: qwen2"],
        exit=2,
    ),
    Case(
        "not a language model",
        "a T5 (encoder-decoder) folder as the actor",
        lambda ctx: [
            "config",
            "show",
            *good(ctx),
            f"actor_rollout_ref.model.path={ctx.model_with_config('t5 model', model_type='t5')}",
        ],
        ["model_type 't5', which is not a causal language model type"],
        exit=2,
    ),
    Case(
        "remote code not trusted",
        "a model folder that ships its own code, trust_remote_code left off",
        lambda ctx: [
            "config",
            "show",
            *good(ctx),
            f"actor_rollout_ref.model.path={ctx.model_with_config('custom', auto_map={'AutoConfig': 'x.C'})}",
        ],
        ["declares its own model code (auto_map)", "actor_rollout_ref.model.trust_remote_code=true"],
        exit=2,
    ),
    Case(
        "resume path missing",
        "trainer.resume_mode pointing at a checkpoint that does not exist",
        show("trainer.resume_mode={tmp}/nowhere/global_step_3"),
        ["trainer.resume_mode={tmp}/nowhere/global_step_3: resume path", "does not exist"],
        exit=2,
    ),
    Case(
        "resume_path without a path",
        "verl's resume_mode=resume_path without resume_from_path",
        show("trainer.resume_mode=resume_path"),
        ["trainer.resume_mode=resume_path needs trainer.resume_from_path"],
        exit=2,
    ),
    Case(
        "resume path not a checkpoint",
        "resume_from_path pointing at the run folder, not a global_step_N",
        show("trainer.resume_from_path={run}"),
        ["must be a global_step_<N> folder"],
        exit=2,
    ),
    Case(
        "run folder under a file",
        "trainer.default_local_dir below a file",
        lambda ctx: ["config", "show", *good(ctx), f"trainer.default_local_dir={ctx.file('a file', 'x')}/run"],
        ["trainer.default_local_dir={tmp}/a file/run cannot be created: {tmp}/a file is a file"],
        exit=2,
    ),
    Case(
        "run folder is a file",
        "trainer.default_local_dir naming an existing file (verl train)",
        lambda ctx: ["train", *good(ctx), f"trainer.default_local_dir={ctx.file('metrics.txt', 'mine')}"],
        ["trainer.default_local_dir={tmp}/metrics.txt is a file, not a folder"],
        exit=2,
    ),
    Case(
        "run folder read-only",
        "a run folder the user cannot write (verl train)",
        train(setup=read_only_run_folder),
        ["{read_only}", "not writable"],
        exit=2,
    ),
    # ---- a user's module that exits or interrupts while imported
    Case(
        "reward exits 0 at import",
        "a reward module that calls sys.exit(0) while imported (verl train)",
        train(setup=reward_module("import sys\nsys.exit(0)")),
        ["verl: stopped: {reward}:2 called sys.exit(0)", "which did not finish"],
        exit=1,
        untouched=False,
    ),
    Case(
        "reward raises SystemExit(3) at import",
        "a reward module that raises SystemExit(3) (verl config show)",
        lambda ctx: ["config", "show", *good(ctx), *reward_module("raise SystemExit(3)")(ctx)],
        ["verl: stopped: {reward}:1 called sys.exit(3)"],
        exit=1,
    ),
    Case(
        "reward raises KeyboardInterrupt at import",
        "a reward module that raises KeyboardInterrupt (verl train)",
        train(setup=reward_module("raise KeyboardInterrupt")),
        ["verl: stopped: KeyboardInterrupt raised by {reward}:1 (no Ctrl-C was pressed)"],
        exit=1,
        untouched=False,
    ),
    # ---- run folders: ownership and other runs' checkpoints
    Case(
        "folder in use",
        "verl train on a folder another live run holds",
        train(setup=locked_by_another_process),
        ["verl: RunFolderBusyError: run folder {run} is in use by another run (host", "pid {holder_pid}, started"],
        exit=1,
    ),
    Case(
        "fresh run over another run",
        "trainer.resume_mode=disable into a folder holding an earlier run",
        train("trainer.resume_mode=disable"),
        [
            "trainer.resume_mode=disable starts a new run",
            "holds checkpoints of an earlier run (global_step_2)",
            "trainer.start_over=true",
        ],
        exit=2,
    ),
    Case(
        "resume across folders",
        "resuming another folder's checkpoint into a folder with its own run",
        train("trainer.resume_mode={other}", setup=in_another_run_folder),
        ["this run resumes from {other}, another run's checkpoint", "holds checkpoints of an earlier run"],
        exit=2,
    ),
    Case(
        "stray folder named like a checkpoint",
        "a user's own global_step_7 folder in the run folder",
        train(setup=stray_step_folder),
        [
            "holds global_step_7: folders named like checkpoints that are incomplete and were not written by this run",
            "Move them out of the folder",
        ],
        exit=2,
    ),
    Case(
        "start over would move the resume point",
        "start_over=true while resuming from the folder's own checkpoint",
        train("trainer.start_over=true", "trainer.resume_mode={checkpoint}"),
        ["trainer.start_over=true would move the checkpoint this run resumes from"],
        exit=2,
    ),
    Case(
        "damaged checkpoint",
        "resuming a checkpoint whose weights changed on disk",
        train(setup=damage_checkpoint),
        ["verl: CheckpointIntegrityError: checkpoint {checkpoint} is damaged", "actor/weights.bin has changed"],
        exit=1,
    ),
    # ---- verl sft: the same checks before any worker starts
    Case(
        "sft: missing model",
        "verl sft with a model folder that does not exist",
        sft("model.path={tmp}/absent"),
        ["model.path:", "absent' is neither a local folder nor a built-in model"],
        exit=2,
    ),
    Case(
        "sft: unknown model type",
        "verl sft on a folder whose model type transformers does not know",
        lambda ctx: [*sft()(ctx), f"model.path={ctx.model_with_config('sft typo', model_type='lama')}"],
        ["model.path:", "model_type 'lama'"],
        exit=2,
    ),
    Case(
        "sft: missing data file",
        "verl sft with a training file that does not exist",
        sft("data.train_files=[{tmp}/absent.parquet]"),
        ["absent.parquet' does not exist"],
        exit=2,
    ),
    Case(
        "sft: a row without the response",
        "verl sft on data whose last row lacks the response (only the first row is read to build a batch)",
        sft(setup=sft_rows_without_last_response),
        ["data.train_files, row 7: data.response_key='extra_info.solution' holds None"],
        exit=2,
    ),
    Case(
        "sft: batch larger than the data",
        "verl sft with a batch larger than the training set",
        sft("data.train_batch_size=16"),
        [f"the training set has {TRAIN_ROWS} prompts, fewer than data.train_batch_size=16"],
        exit=2,
    ),
    Case(
        "sft: lr NaN",
        "verl sft with a NaN learning rate",
        sft("optim.lr=nan"),
        ["optim.lr=nan must be > 0 and finite"],
        exit=2,
    ),
    Case(
        "sft: micro batch zero",
        "verl sft with a zero micro-batch",
        sft("data.micro_batch_size_per_gpu=0"),
        ["data.micro_batch_size_per_gpu=0 must be > 0"],
        exit=2,
    ),
    Case(
        "sft: token budget shorter than a sequence",
        "verl sft with dynamic batches and a 10-token budget",
        sft("use_dynamic_bsz=true", "max_token_len_per_gpu=10"),
        ["max_token_len_per_gpu=10 is shorter than one sequence"],
        exit=2,
    ),
    Case(
        "sft: zero training steps",
        "verl sft with total_training_steps=0",
        sft("trainer.total_training_steps=0"),
        ["trainer.total_training_steps=0 must be > 0"],
        exit=2,
    ),
    Case(
        "sft: logger not installed",
        "verl sft logging to mlflow without mlflow installed",
        sft(setup=hide_package("mlflow")),
        ["trainer.logger includes 'mlflow', but its package cannot be imported"],
        exit=2,
    ),
    Case(
        "sft: fresh run over another run",
        "verl sft with resume_mode=disable in a folder holding a run",
        sft("trainer.resume_mode=disable"),
        ["holds checkpoints of an earlier run (global_step_2)"],
        exit=2,
    ),
    Case(
        "sft: folder in use",
        "verl sft on a folder another live run holds",
        sft(setup=locked_by_another_process),
        ["verl: RunFolderBusyError: run folder {run} is in use by another run", "pid {holder_pid}"],
        exit=1,
    ),
    # ---- verl export: nothing it did not write is replaced
    Case(
        "export into a full folder",
        "verl export into a folder that holds files",
        export("{checkpoint}", "{run}/../my documents"),
        ["is not empty (it holds notes.txt)", "--overwrite"],
        exit=1,
    ),
    Case(
        "export over the run folder",
        "verl export --overwrite into the run folder itself",
        export("{checkpoint}", "{run}", "--overwrite"),
        ["output folder {run} is the run folder that holds the checkpoint", "would delete it"],
        exit=1,
    ),
    Case(
        "export over a parent",
        "verl export --overwrite into a parent of the run folder",
        export("{checkpoint}", "{tmp}", "--overwrite"),
        ["is a folder that holds the checkpoint"],
        exit=1,
    ),
    Case(
        "export over the checkpoint",
        "verl export --overwrite into the checkpoint folder",
        export("{checkpoint}", "{checkpoint}", "--overwrite"),
        ["is the checkpoint itself"],
        exit=1,
    ),
    Case(
        "export inside the checkpoint",
        "verl export into a folder inside the checkpoint",
        export("{checkpoint}", "{checkpoint}/hf"),
        ["is inside the checkpoint", "integrity check"],
        exit=1,
    ),
    Case(
        "export over a non-model folder",
        "verl export --overwrite into a folder that is not an earlier export",
        export("{checkpoint}", "{run}/../my documents", "--overwrite"),
        ["holds no config.json: it is not an earlier export"],
        exit=1,
    ),
    Case(
        "export onto a file",
        "verl export onto an existing file",
        export("{checkpoint}", "{run}/notes.txt"),
        ["exists and is not a folder"],
        exit=1,
    ),
    Case(
        "export of a missing checkpoint",
        "verl export of a folder that does not exist",
        export("{run}/global_step_99", "{tmp}/out"),
        ["global_step_99' does not exist"],
        exit=2,
    ),
]


def user_files(ctx: Ctx) -> None:
    """What a user keeps next to their runs: notes in the run folder, documents beside it."""
    (ctx.run / "notes.txt").write_text("lr sweep notes")
    docs = ctx.tmp / "my documents"
    docs.mkdir(exist_ok=True)
    (docs / "notes.txt").write_text("thesis draft")
