"""Plugin loading through VERL_USE_EXTERNAL_MODULES, in fresh interpreters so each test sees a clean
registry. (Entry-point discovery of installed packages is proven by the vendor-plugin test, which
installs real packages into a fresh environment.)"""

import subprocess
import sys
import textwrap


def run_python(code: str, tmp_path, env_extra: dict[str, str]) -> subprocess.CompletedProcess:
    import os

    env = {**os.environ, "PYTHONPATH": str(tmp_path), **env_extra}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env)


GOOD_PLUGIN = """
from verl.core.engine import EngineRegistry
from verl.core.platform import CPUPlatform, PlatformRegistry
from verl.core.plugins import hookimpl

@PlatformRegistry.register(platform="devchip")
class DevChip(CPUPlatform):
    vendor_name = "devco"
    priority = 10

@EngineRegistry.register(model_type="language_model", backend="toy", device="cpu", vendor="devco")
class ToyEngine:
    pass

@hookimpl
def verl_plugin_info():
    return {"version": "9.9"}
"""


def test_external_module_registers_platform_engine_and_hooks(tmp_path):
    (tmp_path / "dev_plugin.py").write_text(GOOD_PLUGIN)
    result = run_python(
        """
        from verl.core.platform import get_platform
        from verl.core.engine import EngineRegistry
        from verl.core.plugins import plugin_manager, plugin_records
        p = get_platform()
        print("platform", p.name, p.vendor_name)
        print("engine", EngineRegistry.get("language_model", "toy").__name__)
        print("record", plugin_records()["dev_plugin"].distribution)
        print("hook", plugin_manager().hook.verl_plugin_info())
        """,
        tmp_path,
        {"VERL_USE_EXTERNAL_MODULES": "dev_plugin"},
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "platform devchip devco" in lines
    assert "engine ToyEngine" in lines
    assert "record <external>" in lines
    assert "hook [{'version': '9.9'}]" in lines


def test_failing_plugin_is_reported_once_by_name_and_others_load(tmp_path):
    (tmp_path / "dev_plugin.py").write_text(GOOD_PLUGIN)
    (tmp_path / "broken_plugin.py").write_text("raise ImportError('libacme.so: cannot open shared object file')\n")
    result = run_python(
        """
        from verl.core.plugins import load_plugins, failed_plugins
        from verl.core.platform import get_platform
        load_plugins(); load_plugins()  # a second call must not report again
        print("platform", get_platform().name)
        print("failed", sorted(failed_plugins()))
        """,
        tmp_path,
        {"VERL_USE_EXTERNAL_MODULES": "broken_plugin, dev_plugin"},
    )
    assert result.returncode == 0, result.stderr
    assert "platform devchip" in result.stdout
    assert "failed ['broken_plugin']" in result.stdout
    warnings = [line for line in result.stderr.splitlines() if "broken_plugin" in line]
    assert len(warnings) == 1, result.stderr
    assert "failed to load" in warnings[0] and "libacme.so: cannot open shared object file" in warnings[0]


def test_report_lists_platforms_engines_and_failures(tmp_path):
    (tmp_path / "dev_plugin.py").write_text(GOOD_PLUGIN)
    (tmp_path / "broken_plugin.py").write_text("raise RuntimeError('boom')\n")
    import os

    env = {**os.environ, "PYTHONPATH": str(tmp_path), "VERL_USE_EXTERNAL_MODULES": "dev_plugin,broken_plugin"}
    out = subprocess.run(
        [sys.executable, "-m", "verl.core"], capture_output=True, text=True, env=env, check=True
    ).stdout
    assert "selected platform: devchip" in out
    assert "devchip" in out and "cpu" in out
    assert "backend='toy'" in out and "vendor='devco'" in out and "[<external>]" in out
    assert "broken_plugin" in out and "FAILED: RuntimeError: boom" in out
