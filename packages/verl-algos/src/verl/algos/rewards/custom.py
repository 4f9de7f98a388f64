"""Loading a user's reward function from a file (``custom_reward_function.path`` and ``.name``)."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable
from typing import Any

from verl.algos.rewards.scoring import RewardSetupError


def load_custom_reward_function(
    path: str | os.PathLike, name: str = "compute_score", reward_kwargs: dict[str, Any] | None = None
) -> Callable[..., Any]:
    """Import ``path`` and return its function ``name``, with ``reward_kwargs`` bound as keywords.

    The function has verl's signature ``fn(data_source, solution_str, ground_truth, extra_info=None)``
    and returns a float or a dict with ``score``. Raises :class:`RewardSetupError` (a RuntimeError)
    naming the problem: the file is missing, fails to import, lacks ``name``, or ``name`` is not callable.
    """
    if not path:
        raise RewardSetupError("custom_reward_function.path is empty: give the path of a Python file")
    path = os.path.abspath(os.fspath(path))
    if not os.path.isfile(path):
        raise RewardSetupError(
            f"custom_reward_function.path={path} does not exist (or is not a file); give the path of a Python file"
        )
    # A name unique to the path, so two reward files never replace each other in sys.modules.
    module_name = "verl_custom_reward_" + hashlib.sha1(path.encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise RewardSetupError(f"custom_reward_function.path={path} is not an importable Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        sys.modules.pop(module_name, None)
        raise RewardSetupError(f"custom_reward_function.path={path} failed to import: {type(e).__name__}: {e}") from e
    if not hasattr(module, name):
        functions = sorted(n for n, v in vars(module).items() if inspect.isfunction(v) and not n.startswith("_"))
        raise RewardSetupError(
            f"custom_reward_function.name={name!r} is not defined in {path}; functions defined there: "
            f"{functions or 'none'}"
        )
    fn = getattr(module, name)
    if not callable(fn):
        raise RewardSetupError(
            f"custom_reward_function.name={name!r} in {path} is a {type(fn).__name__}, not a function"
        )
    bound = functools.partial(fn, **reward_kwargs) if reward_kwargs else fn

    @functools.wraps(fn)
    def custom_reward(*args: Any, **kwargs: Any) -> Any:
        return bound(*args, **kwargs)

    custom_reward.verl_name = f"{name} from {path}"  # type: ignore[attr-defined]
    return custom_reward
