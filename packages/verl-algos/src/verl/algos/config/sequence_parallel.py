"""The layout rules of Ulysses sequence parallelism that a config can check before Ray starts (``verl
train``'s roles and ``verl sft`` alike); the engine applies the same sizes (``fsdp_parallel_dims``)."""

from __future__ import annotations


def check_sequence_parallel(
    key: str, sp: int, world: int, world_key: str, fsdp_key: str, fsdp_size: int, padding_key: str, padding: bool
) -> None:
    """ValueError (naming ``key`` and the setting to change) when groups of ``sp`` ranks cannot split ``world``
    ranks, neither of ``sp`` and the FSDP shard size divides the other, or the rows are not packed."""
    if sp == 1:
        return
    if world % sp:
        raise ValueError(
            f"{key}={sp} must divide {world_key} = {world} ranks (a group of {sp} ranks counts as one data-parallel "
            "rank)"
        )
    if fsdp_size != -1 and fsdp_size % sp and sp % fsdp_size:
        raise ValueError(f"{key}={sp} and {fsdp_key}={fsdp_size}: one must divide the other; change one of them")
    if not padding:
        raise ValueError(f"{key}={sp} splits the packed rows of micro-batches and needs {padding_key}=true")
