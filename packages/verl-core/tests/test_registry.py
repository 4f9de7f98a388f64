import pytest

from verl.core.registry import Registry, RegistryError, registering_as


def test_single_key_register_and_get():
    reg = Registry("advantage estimator")

    @reg.register("grpo")
    def grpo():
        return "grpo"

    assert reg.get("grpo") is grpo
    assert reg.get(name="grpo") is grpo
    assert "grpo" in reg
    assert reg.names() == ["grpo"]


def test_unknown_name_lists_nearest_and_registered():
    reg = Registry("advantage estimator")
    for name in ("grpo", "gae", "rloo"):
        reg.register(name)(lambda: None)
    with pytest.raises(RegistryError) as exc:
        reg.get("grp0")
    msg = str(exc.value)
    assert "no advantage estimator registered for 'grp0'" in msg
    assert "Nearest: 'grpo'" in msg
    assert "'gae'" in msg and "'rloo'" in msg


def test_empty_registry_error_says_nothing_registered():
    with pytest.raises(RegistryError, match="no rollout engine is registered"):
        Registry("rollout engine").get("hf")


def test_list_values_register_every_combination():
    reg = Registry("engine", keys=("backend", "device", "vendor"), generic=("vendor",))

    class E:
        pass

    reg.register(backend=["fsdp", "fsdp2"], device=["cpu", "cuda"])(E)
    for backend in ("fsdp", "fsdp2"):
        for device in ("cpu", "cuda"):
            assert reg.get(backend=backend, device=device, vendor="nvidia") is E
    assert len(reg.entries()) == 4


def test_vendor_entry_wins_over_generic_and_generic_is_fallback():
    reg = Registry("engine", keys=("backend", "device", "vendor"), generic=("vendor",))

    class Generic:
        pass

    class Acme:
        pass

    reg.register(backend="fsdp", device="cpu")(Generic)
    reg.register(backend="fsdp", device="cpu", vendor="acme")(Acme)
    assert reg.get(backend="fsdp", device="cpu", vendor="acme") is Acme
    assert reg.get(backend="fsdp", device="cpu", vendor="intel") is Generic
    with pytest.raises(RegistryError, match="device='npu'"):
        reg.get(backend="fsdp", device="npu", vendor="huawei")


def test_duplicate_registration_is_an_error_unless_override():
    reg = Registry("policy loss")
    reg.register("vanilla")(lambda: 1)
    with pytest.raises(ValueError, match="already registered"):
        reg.register("vanilla")(lambda: 2)

    def replacement():
        return 3

    reg.register("vanilla", override=True)(replacement)
    assert reg.get("vanilla") is replacement


def test_missing_and_unexpected_key_fields_are_reported():
    reg = Registry("engine", keys=("backend", "device"))
    with pytest.raises(TypeError, match=r"missing \['device'\]"):
        reg.register(backend="fsdp")
    with pytest.raises(TypeError, match=r"unexpected \['colour'\]"):
        reg.register(backend="fsdp", device="cpu", colour="red")


def test_origin_recorded_from_plugin_context():
    reg = Registry("thing")
    with registering_as("acme-plugin"):
        reg.register("x")(lambda: None)
    reg.register("y")(test_origin_recorded_from_plugin_context)
    origins = {e.key[0]: e.origin for e in reg.entries()}
    assert origins["x"] == "acme-plugin"
    assert origins["y"] == __name__  # a test module is not a verl package: reported by module
