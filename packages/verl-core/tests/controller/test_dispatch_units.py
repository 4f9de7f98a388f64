"""The controller's pure parts, without Ray processes: data-parallel split/join arithmetic, dispatch-mode
registration, the register decorator, worker specs, dp-layout validation and init_ray's argument checks."""

from __future__ import annotations

import pytest
import torch

from verl.core.controller import (
    DISPATCH_MODES,
    Dispatch,
    DPCoordinates,
    DPInfo,
    GroupLayout,
    ShardLayout,
    Worker,
    WorkerSpec,
    init_ray,
    register,
    register_dispatch_mode,
    worker_env_vars,
)
from verl.core.controller.builtin_modes import collect_all, dispatch_one_to_all
from verl.core.controller.decorator import registered_methods
from verl.core.controller.dp_shards import join_dp_outputs, split_for_dp
from verl.core.controller.role import validated_dp_layout
from verl.core.protocol import DataProto


def _rows(n: int) -> DataProto:
    return DataProto.from_dict({"x": torch.arange(n)}, non_tensors={"id": list(range(n))})


@pytest.mark.parametrize("dp", [1, 2, 3, 4])
@pytest.mark.parametrize("n", [1, 2, 5, 7, 8, 9])
def test_split_pads_to_equal_shards_and_join_restores_the_batch(n, dp):
    shards, layout = split_for_dp(_rows(n), dp)
    size = -(-n // dp)
    assert [len(s) for s in shards] == [size] * dp == list(layout.rows)
    assert sum(layout.pads) == size * dp - n
    # padding is trailing: every real row comes before every padding row
    real = [list(s.batch["x"][: len(s) - p].tolist()) for s, p in zip(shards, layout.pads)]
    assert sum(real, []) == list(range(n))
    joined = join_dp_outputs(shards, layout)
    assert joined.batch["x"].tolist() == list(range(n)) and list(joined.non_tensor_batch["id"]) == list(range(n))


def test_join_removes_padding_in_proportion_to_samples_per_row():
    shards, layout = split_for_dp(_rows(5), 4)  # rows (2, 2, 2, 2), pads (0, 0, 1, 2)
    outputs = [s.repeat(3, interleave=True) for s in shards]
    joined = join_dp_outputs(outputs, layout)
    assert joined.batch["x"].tolist() == torch.arange(5).repeat_interleave(3).tolist()


def test_join_refuses_outputs_whose_padding_cannot_be_located():
    shards, layout = split_for_dp(_rows(3), 2)  # rows (2, 2), pads (0, 1)
    with pytest.raises(ValueError, match="one row per input row"):
        join_dp_outputs([shards[0], shards[1][:1].repeat(3)], layout)
    with pytest.raises(TypeError, match="DP_COMPUTE_METRIC"):
        join_dp_outputs([{"loss": 1.0}, {"loss": 2.0}], layout)


def test_split_names_what_was_wrong():
    with pytest.raises(TypeError, match="expected a DataProto"):
        split_for_dp([1, 2, 3], 2)
    with pytest.raises(ValueError, match="empty"):
        split_for_dp(DataProto.from_dict({"x": torch.zeros(0)}), 2)


def test_join_without_a_layout_concatenates():
    assert join_dp_outputs([_rows(2), _rows(1)], None).batch["x"].tolist() == [0, 1, 0]
    assert ShardLayout((2, 2), (0, 1)).dp_size == 2


def test_dispatch_names_resolve_to_registered_modes():
    assert Dispatch.DP_COMPUTE_PROTO == "dp_compute_proto"
    assert {"one_to_all", "all_to_all", "rank_zero", "dp_compute_proto", "dp_compute_metric"} <= set(Dispatch)
    with pytest.raises(AttributeError, match="registered modes: .*DP_COMPUTE_PROTO"):
        _ = Dispatch.NO_SUCH_MODE


def test_adding_a_mode_is_a_registration():
    register_dispatch_mode("units_broadcast", dispatch_one_to_all, collect_all, override=True)
    try:
        assert Dispatch.UNITS_BROADCAST == "units_broadcast"
        assert DISPATCH_MODES.get("units_broadcast").collect_fn is collect_all
        with pytest.raises(ValueError, match="already registered"):
            register_dispatch_mode("units_broadcast", dispatch_one_to_all, collect_all)
    finally:
        DISPATCH_MODES.unregister(name="units_broadcast")
    with pytest.raises(ValueError, match="lower-case identifiers"):
        register_dispatch_mode("Bad Name", dispatch_one_to_all, collect_all)


def test_register_checks_its_arguments():
    with pytest.raises(ValueError, match="unknown dispatch_mode 'dp_compute_protoo'.*Nearest"):
        register(dispatch_mode="dp_compute_protoo")
    with pytest.raises(TypeError, match="not a bare @register"):

        @register
        def f(self):  # pragma: no cover - never defined
            pass

    with pytest.raises(TypeError, match="is async"):

        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        async def g(self):  # pragma: no cover - never defined
            pass


class _Base(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def step(self):
        return "base"

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def score(self):
        return "base"

    def helper(self):
        return "not registered"


class _Child(_Base):
    def step(self):  # an undecorated override keeps the base registration
        return "child"

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def score(self):
        return "child"


def test_registered_methods_follow_inheritance():
    methods = registered_methods(_Child)
    assert set(methods) == {"step", "score"}
    assert methods["step"].dispatch_mode == "one_to_all"
    assert methods["score"].dispatch_mode == "dp_compute_proto" and methods["score"].blocking is False


def test_worker_spec_accepts_the_usual_forms_and_rejects_non_workers():
    assert WorkerSpec.of(_Base) == WorkerSpec(_Base)
    assert WorkerSpec.of((_Base, (1,), {"a": 2})) == WorkerSpec(_Base, (1,), {"a": 2})
    with pytest.raises(TypeError, match="must subclass verl.core.controller.Worker"):
        WorkerSpec.of(dict)


def test_worker_dp_info_defaults_to_pure_data_parallel_and_validates(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    worker = _Base()
    assert worker.dp_info == DPInfo(3, 4, True)
    worker.set_dp_info(dp_rank=1, dp_size=2, is_collect=False)
    assert (worker.dp_rank, worker.dp_size, worker.is_collect_rank) == (1, 2, False)
    with pytest.raises(ValueError, match="does not divide the world size"):
        worker.set_dp_info(dp_rank=0, dp_size=3, is_collect=True)


def test_dp_layout_validation():
    layout = validated_dp_layout(
        "actor", [DPInfo(0, 2, True), DPInfo(0, 2, False), DPInfo(1, 2, True), DPInfo(1, 2, False)]
    )
    assert layout.members_of(1) == [2, 3] and layout.collect_position(1) == 2
    with pytest.raises(ValueError, match="exactly one collect rank"):
        validated_dp_layout("actor", [DPInfo(0, 1, True), DPInfo(0, 1, True)])
    with pytest.raises(ValueError, match="disagree"):
        validated_dp_layout("actor", [DPInfo(0, 1, True), DPInfo(1, 2, True)])
    assert layout.data_parallel() == DPCoordinates((0, 0, 1, 1), 2, (True, False, True, False))
    with pytest.raises(ValueError, match="did not ask"):
        GroupLayout((0, 1)).members_of(0)
    with pytest.raises(ValueError, match="did not ask"):
        GroupLayout((0, 1)).data_parallel()
    with pytest.raises(ValueError, match="all or none"):
        GroupLayout((0, 1), dp_ranks=(0, 0))
    with pytest.raises(ValueError, match="one entry per rank"):
        GroupLayout((0, 1), (0,), 1, (True,))


def test_worker_env_vars_carry_verl_settings_and_pythonpath(monkeypatch):
    monkeypatch.setenv("VERL_PLATFORM", "cpu")
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    monkeypatch.setenv("UNRELATED_SETTING", "x")
    env = worker_env_vars()
    assert env["VERL_PLATFORM"] == "cpu" and env["PYTHONPATH"] == "/somewhere"
    assert "UNRELATED_SETTING" not in env


def test_init_ray_refuses_local_resources_when_joining_a_cluster(monkeypatch):
    with pytest.raises(ValueError, match="only apply when starting a local Ray"):
        init_ray(address="10.0.0.1:6379", num_cpus=4)
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    with pytest.raises(ValueError, match="joins an existing cluster"):
        init_ray(num_gpus=1)
