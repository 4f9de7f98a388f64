"""Behaviour before and after a change: the same short runs on two revisions of this repository, compared.

    python tools/compare_revisions.py [--before HEAD] [--steps 5] [--keep DIR]

"Before" is a git revision, checked out into a temporary worktree; "after" is this working tree, changes
included. Each side runs, with its own packages first on PYTHONPATH (the editable installs are path
entries, so a PYTHONPATH entry wins), the same commands a user types:

- ``verl config show -r <recipe>`` for every built-in recipe: the printed values must be equal (compared
  as YAML: the order of keys may change);
- a GRPO run and a PPO run with a critic (GAE) of ``--steps`` steps on a tiny random Qwen2, two workers,
  one seed, then ``verl export`` of the last checkpoint: every per-step metric except wall-clock timings
  must be equal, and so must every exported tensor.

Exit status 0 when everything is equal, 1 with the differences listed otherwise. Refactors that reorder
floating-point work legitimately change the last bits: ``--rtol`` allows that, and the report shows the
largest relative difference either way.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("verl-core", "verl-engines", "verl-algos", "verl-platform-cuda", "verl-platform-rocm", "verl-platform-npu")
TIMING_PREFIXES = ("timing_s/", "perf/throughput", "perf/time_per_step", "perf/mfu")


def side_env(root: Path) -> dict[str, str]:
    paths = [str(root / "packages" / name / "src") for name in PACKAGES]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def verl(root: Path, args: list[str], cwd: Path, log: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "verl.algos.cli", *args]
    with open(log, "ab") as out:
        done = subprocess.run(command, cwd=cwd, env=side_env(root), stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise SystemExit(f"{' '.join(args[:2])} failed on {root} (exit {done.returncode}):\n{tail}")
    return done


def build_fixtures(folder: Path) -> tuple[Path, Path]:
    """The tiny model (built once, by this tree's test helpers, so both sides read the same bytes)."""
    tests = REPO / "packages" / "verl-algos" / "tests"
    sys.path[:0] = [str(REPO / "tests" / "support"), str(tests), str(tests / "trainer")]
    from algos_test_helpers import write_tiny_model
    from cli_runs import write_reward  # a reward that varies within a group, so updates are non-zero

    return Path(write_tiny_model(str(folder / "tiny-model"))), write_reward(folder)


def run_overrides(model: Path, reward: Path, out: Path, steps: int) -> list[str]:
    from cli_runs import tiny_overrides  # the trainer tests' tiny GRPO run on two workers

    return tiny_overrides(str(model), out, reward, steps, f"trainer.save_freq={steps}", "trainer.seed=7")


RUNS = {
    "grpo": ["-r", "grpo"],
    "ppo": ["-r", "ppo", "critic.optim.lr=1e-3"],
}


def run_side(root: Path, work: Path, model: Path, reward: Path, steps: int) -> dict:
    work.mkdir(parents=True)
    log = work / "commands.log"
    shown = {}
    for recipe in recipes(root):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "verl.algos.cli",
                "config",
                "show",
                "-r",
                recipe,
                f"actor_rollout_ref.model.path={model}",
            ],
            cwd=work,
            env=side_env(root),
            capture_output=True,
            text=True,
        )
        shown[recipe] = done.stdout if done.returncode == 0 else f"exit {done.returncode}: {done.stderr[-2000:]}"
    runs = {}
    for name, (flag, recipe, *extra) in RUNS.items():
        out = work / name
        critic = [f"critic.model.path={model}"] if name == "ppo" else []
        verl(root, ["train", flag, recipe, *run_overrides(model, reward, out, steps), *critic, *extra], work, log)
        exported = work / f"{name}-hf"
        verl(root, ["export", str(out / f"global_step_{steps}"), str(exported)], work, log)
        records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
        runs[name] = {"metrics": records, "weights": exported}
    return {"config": shown, "runs": runs}


def recipes(root: Path) -> list[str]:
    return sorted(p.stem for p in (root / "packages/verl-algos/src/verl/algos/config/recipes").glob("*.yaml"))


def same_values(before: str | None, after: str | None) -> bool:
    """Whether two ``config show`` outputs hold the same keys and values (the order of keys within a
    section may change when a node's fields move to a base class)."""
    if before is None or after is None:
        return before == after
    try:
        return yaml.safe_load(before) == yaml.safe_load(after)
    except yaml.YAMLError:
        return before == after


def relative_difference(a: float, b: float) -> float:
    if a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)):
        return 0.0
    return abs(a - b) / max(abs(a), abs(b), 1e-12)


def compare_metrics(name: str, before: list[dict], after: list[dict], rtol: float) -> tuple[list[str], float]:
    problems, worst = [], 0.0
    if len(before) != len(after):
        problems.append(f"{name}: {len(before)} metric records before, {len(after)} after")
    for old, new in zip(before, after):
        step = old.get("step")
        keys_old = {k for k in old if not k.startswith(TIMING_PREFIXES)}
        keys_new = {k for k in new if not k.startswith(TIMING_PREFIXES)}
        for key in sorted(keys_old ^ keys_new):
            problems.append(f"{name} step {step}: metric {key!r} only {'before' if key in keys_old else 'after'}")
        for key in sorted(keys_old & keys_new):
            a, b = old[key], new[key]
            if isinstance(a, (int, float)) and isinstance(b, (int, float)):
                diff = relative_difference(float(a), float(b))
                worst = max(worst, diff)
                if diff > rtol:
                    problems.append(f"{name} step {step}: {key} {a!r} before, {b!r} after (rel. {diff:.2e})")
            elif a != b:
                problems.append(f"{name} step {step}: {key} {a!r} before, {b!r} after")
    return problems, worst


def compare_weights(name: str, before: Path, after: Path, rtol: float) -> tuple[list[str], float]:
    import torch
    from safetensors.torch import load_file

    def tensors(folder: Path) -> dict:
        found = {}
        for file in sorted(folder.glob("*.safetensors")):
            found.update(load_file(str(file)))
        return found

    old, new = tensors(before), tensors(after)
    problems, worst = [], 0.0
    for key in sorted(set(old) ^ set(new)):
        problems.append(f"{name} weights: {key} only {'before' if key in old else 'after'}")
    for key in sorted(set(old) & set(new)):
        a, b = old[key].double(), new[key].double()
        if a.shape != b.shape:
            problems.append(f"{name} weights: {key} shape {tuple(a.shape)} before, {tuple(b.shape)} after")
            continue
        diff = float(((a - b).abs() / a.abs().clamp_min(1e-12)).max()) if not torch.equal(a, b) else 0.0
        worst = max(worst, diff)
        if diff > rtol:
            problems.append(f"{name} weights: {key} differs (max rel. {diff:.2e})")
    return problems, worst


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="HEAD", help="git revision to compare the working tree against")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rtol", type=float, default=0.0, help="relative tolerance (default: equal)")
    parser.add_argument("--keep", default=None, help="keep the runs in this new folder (default: a temporary one)")
    args = parser.parse_args()

    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="verl-compare-"))
    work.mkdir(parents=True, exist_ok=True)
    worktree = work / "before-tree"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(worktree), args.before], check=True)
    try:
        model, reward = build_fixtures(work)
        before = run_side(worktree, work / "before", model, reward, args.steps)
        after = run_side(REPO, work / "after", model, reward, args.steps)
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(worktree)], check=False)

    problems, worst = [], 0.0
    sides = {"before": before, "after": after}
    for recipe in sorted(set(before["config"]) | set(after["config"])):
        if same_values(before["config"].get(recipe), after["config"].get(recipe)):
            continue
        problems.append(
            f"verl config show -r {recipe}: values differ (diff {work}/{{before,after}}/config-{recipe}.yaml)"
        )
        for side, found in sides.items():
            (work / side / f"config-{recipe}.yaml").write_text(str(found["config"].get(recipe)))
    for name in RUNS:
        found, w = compare_metrics(name, before["runs"][name]["metrics"], after["runs"][name]["metrics"], args.rtol)
        problems += found
        worst = max(worst, w)
        found, w = compare_weights(name, before["runs"][name]["weights"], after["runs"][name]["weights"], args.rtol)
        problems += found
        worst = max(worst, w)
    steps = {name: len(before["runs"][name]["metrics"]) for name in RUNS}
    print(f"compared {args.before} with the working tree: config of {len(before['config'])} recipes, runs {steps}")
    print(f"largest relative difference in metrics and weights: {worst:.3e}")
    for line in problems:
        print("DIFF", line)
    print("equal" if not problems else f"{len(problems)} differences")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
