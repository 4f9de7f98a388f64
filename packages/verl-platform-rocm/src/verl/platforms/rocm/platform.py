"""``ROCmPlatform``: AMD GPUs through a HIP build of torch (``torch.cuda`` API) and RCCL."""

from __future__ import annotations

import os

import torch

from verl.core.platform import PlatformRegistry
from verl.platforms.cuda import CUDAPlatform

#: ROCr runtime filter, applied before HIP_VISIBLE_DEVICES: HIP's device indices count the devices it left.
ROCR_VISIBLE_DEVICES = "ROCR_VISIBLE_DEVICES"


@PlatformRegistry.register(platform="rocm")
class ROCmPlatform(CUDAPlatform):
    """AMD GPUs with a ROCm (HIP) build of torch.

    The torch device type stays "cuda" and the process-group backend "nccl" (RCCL answers to that name),
    so everything but availability and device visibility is inherited from :class:`CUDAPlatform`.
    """

    device_name = "cuda"
    vendor_name = "amd"
    dist_backend = "nccl"
    visible_devices_env = "HIP_VISIBLE_DEVICES"
    ray_resource_name = "GPU"
    # Above cuda's: on a HIP build this platform is the right one. (CUDAPlatform refuses HIP builds
    # anyway, so the two are never available together; the order only documents the intent.)
    priority = 110
    hardware_noun = "AMD GPU"
    driver_check = "rocm-smi"

    @classmethod
    def build_problem(cls) -> str | None:
        if not torch.version.hip:
            kind = f"a CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only"
            return (
                f"torch {torch.__version__} is {kind} build, not a ROCm build (torch.version.hip is None); "
                "install a ROCm build of torch (https://pytorch.org/get-started/locally/) to use AMD GPUs"
            )
        return None

    @classmethod
    def build_description(cls) -> str:
        return f"torch {torch.__version__} (HIP {torch.version.hip})"

    @classmethod
    def visibility_settings(cls) -> str:
        names = ["HIP_VISIBLE_DEVICES", ROCR_VISIBLE_DEVICES, "CUDA_VISIBLE_DEVICES"]
        shown = [f"{n}={os.environ[n]!r}" for n in names if n in os.environ]
        return ", ".join(shown) if shown else "HIP_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES unset"

    def visible_devices_for(self, local_ids: list[int]) -> dict[str, str]:
        """Restrict a worker to ``local_ids`` (indices as HIP and Ray count them on this node).

        The ROCr runtime applies ``ROCR_VISIBLE_DEVICES`` first and HIP numbers what is left, so the
        variables only agree when they are set together. The selection is therefore made at the ROCr
        level (through an inherited ``ROCR_VISIBLE_DEVICES`` list, if this process has one), and HIP and
        CUDA_VISIBLE_DEVICES (which HIP and torch also read) number the selected devices from 0: whatever
        the worker inherited, it sees exactly these devices, as devices 0..n-1.
        """
        inherited = os.environ.get(ROCR_VISIBLE_DEVICES, "").strip()
        if inherited:
            pool = [d.strip() for d in inherited.split(",")]
            bad = [i for i in local_ids if not 0 <= i < len(pool)]
            if bad:
                raise ValueError(
                    f"device indices {bad} are outside ROCR_VISIBLE_DEVICES={inherited!r} ({len(pool)} devices); "
                    "the indices count the devices that ROCR_VISIBLE_DEVICES leaves visible"
                )
            selected = [pool[i] for i in local_ids]
        else:
            selected = [str(i) for i in local_ids]
        renumbered = ",".join(str(i) for i in range(len(local_ids)))
        return {
            ROCR_VISIBLE_DEVICES: ",".join(selected),
            "HIP_VISIBLE_DEVICES": renumbered,
            "CUDA_VISIBLE_DEVICES": renumbered,
        }
