"""verl platform plugin for AMD GPUs (ROCm).

Loaded through the ``verl.platforms`` entry point ``rocm``; importing it registers :class:`ROCmPlatform`
under the name "rocm". A HIP build of torch drives AMD GPUs through the ``torch.cuda`` API, so the
platform subclasses the CUDA one and changes only what differs: the build it accepts, the vendor and
the visible-devices variables.
"""

from verl.platforms.rocm.platform import ROCmPlatform

__all__ = ["ROCmPlatform"]
