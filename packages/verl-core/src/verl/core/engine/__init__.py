"""Engine interfaces and their registries."""

from verl.core.engine.adapter import LoRAAdapter
from verl.core.engine.model_types import LANGUAGE_MODEL, MODEL_TYPES, VALUE_MODEL
from verl.core.engine.registry import DeviceRegistry, EngineRegistry, RolloutRegistry, engine_device_key
from verl.core.engine.requests import FinishedRequest, RequestStream
from verl.core.engine.rollout import RolloutEngine, SamplingParams
from verl.core.engine.training import LossFn, TrainingEngine

__all__ = [
    "LANGUAGE_MODEL",
    "MODEL_TYPES",
    "VALUE_MODEL",
    "DeviceRegistry",
    "EngineRegistry",
    "FinishedRequest",
    "LoRAAdapter",
    "LossFn",
    "RequestStream",
    "RolloutEngine",
    "RolloutRegistry",
    "SamplingParams",
    "TrainingEngine",
    "engine_device_key",
]
