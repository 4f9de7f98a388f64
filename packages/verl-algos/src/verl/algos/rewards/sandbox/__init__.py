"""A sandbox for running untrusted, model-written Python programs (the ``code`` reward's tests).

>>> sandbox = Sandbox(SandboxLimits(cpu_time_s=2, wall_time_s=5))
>>> sandbox.run("print(int(input()) * 2)", stdin="21").stdout
'42\\n'

See :mod:`.isolation` for what is isolated, :mod:`.limits` for the limits and :mod:`.runner` for how a
run goes. Linux only.
"""

from verl.algos.rewards.sandbox.isolation import Isolation
from verl.algos.rewards.sandbox.limits import SandboxLimits
from verl.algos.rewards.sandbox.result import RunResult, RunStatus, SandboxUnavailableError
from verl.algos.rewards.sandbox.runner import Sandbox

__all__ = ["Isolation", "RunResult", "RunStatus", "Sandbox", "SandboxLimits", "SandboxUnavailableError"]
