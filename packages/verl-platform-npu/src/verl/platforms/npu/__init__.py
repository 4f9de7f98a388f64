"""verl platform plugin for Huawei Ascend NPUs.

Loaded through the ``verl.platforms`` entry point ``npu``; importing it registers :class:`NPUPlatform`
under the name "npu". Importing it never imports ``torch_npu``: that happens on first use (availability
probe or a device call), so this package can be installed, and listed by ``python -m verl.core``, on a
machine without torch_npu or the CANN runtime.
"""

from verl.platforms.npu.platform import NPUPlatform

__all__ = ["NPUPlatform"]
