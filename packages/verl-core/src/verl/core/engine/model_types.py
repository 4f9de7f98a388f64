"""The kinds of model a training engine is registered for (the first key of ``EngineRegistry``).

Workers ask the registry for ``(model type, backend)``; engines register under the same names. They live
here, with the interface, so neither side spells them as string literals.
"""

from __future__ import annotations

#: A causal language model: the actor, the reference policy, the rollout model, SFT.
LANGUAGE_MODEL = "language_model"
#: A causal LM backbone with a scalar head per token: a PPO critic or a reward model.
VALUE_MODEL = "value_model"

MODEL_TYPES = (LANGUAGE_MODEL, VALUE_MODEL)
