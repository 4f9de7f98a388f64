"""verl-core: the hardware-independent core of verl.

Importing this package is cheap and imports no vendor library (torch_npu, vllm, sglang, megatron).
"""

__version__ = "0.1.0"
