"""verl platform plugin for NVIDIA GPUs.

Loaded through the ``verl.platforms`` entry point ``cuda``; importing it registers :class:`CUDAPlatform`
under the name "cuda". The ROCm plugin subclasses :class:`CUDAPlatform`, because a HIP build of torch
drives AMD GPUs through the same ``torch.cuda`` API.
"""

from verl.platforms.cuda.platform import CUDAPlatform

__all__ = ["CUDAPlatform"]
