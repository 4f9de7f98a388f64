"""Installing verl the way users and vendors do, into one fresh virtual environment per test session:

1. ``verl-core`` alone: it imports, selects the CPU platform and imports no vendor library.
2. Then verl-engines, the npu platform package (on a machine without torch_npu), the vendor-plugin
   example (``examples/vendor-plugin``, the fictitious Acme XPU) and a second tiny plugin whose import
   raises: every plugin is discovered through its entry point and reported with its distribution, the
   Acme platform is selected when visible or forced, its engine wins on its platform and the generic
   FSDP engine elsewhere, and the broken plugin is reported by name while the others load.

Every check runs in subprocesses of the fresh environment's interpreter, as a user would. The fresh
environment sees the test runner's third-party packages (torch, ray, transformers, ... through a path file
to links of them), never its verl packages: pip still resolves every dependency of what it installs, but
finds them installed instead of unpacking gigabytes of wheels again (that took two minutes of every CI run).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
import venv
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "vendor-plugin"
#: Libraries a bare verl-core must never import.
VENDOR_LIBRARIES = ("torch_npu", "vllm", "sglang", "megatron")
BROKEN_PLUGIN_ERROR = "Acme firmware 0.0 is too old for this plugin: update the driver"

BROKEN_PLUGIN_PYPROJECT = """
[build-system]
requires = ["hatchling>=1.25"]
build-backend = "hatchling.build"

[project]
name = "verl-broken-plugin-example"
version = "0.1.0"
dependencies = ["verl-core"]

[project.entry-points."verl.plugins"]
broken = "verl_broken_plugin"

[tool.hatch.build.targets.wheel]
packages = ["src/verl_broken_plugin"]
"""

CORE_ONLY_PROBE = """
import json, sys
from importlib.metadata import distributions
import verl.core
from verl.core.platform import get_platform
from verl.core.plugins import load_plugins

records = load_plugins()
platform = get_platform()
print(json.dumps({
    "platform": platform.name,
    "plugins": sorted(records),
    "verl_distributions": sorted({d.metadata["Name"] for d in distributions() if d.metadata["Name"].startswith("verl")}),
    "vendor_modules": sorted(m for m in sys.modules if m.split(".")[0] in VENDOR_LIBRARIES),
}))
""".replace("VENDOR_LIBRARIES", repr(VENDOR_LIBRARIES))


@dataclass
class FreshVenv:
    path: Path
    #: Working directory of the subprocesses (not the repository, so nothing is imported from a checkout).
    workdir: Path
    #: What a process saw when only verl-core was installed (captured before anything else was added).
    core_only_probe: dict
    core_only_report: str

    @property
    def python(self) -> str:
        return str(self.path / "bin" / "python")

    def env(self, **extra: str) -> dict[str, str]:
        """This machine's environment minus anything that would leak the test runner's setup."""
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("VERL_", "ACME_")) and k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
        }
        env.update(VIRTUAL_ENV=str(self.path), PATH=f"{self.path / 'bin'}{os.pathsep}{env.get('PATH', '')}")
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env.update(extra)
        return env

    def run(self, *args: str, cwd: Path | None = None, timeout: float = 600, **extra_env: str):
        return subprocess.run(
            [self.python, *args],
            cwd=cwd or self.workdir,
            env=self.env(**extra_env),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def pip_install(self, *requirements: str) -> None:
        # The test runner's own torch build, pinned on every install: an unpinned torch would resolve to
        # a multi-GB CUDA build (pip finds the CPU wheel through its configured find-links).
        result = self.run(
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "--no-input",
            "--progress-bar",
            "off",
            f"torch=={torch.__version__}",
            *requirements,
            timeout=1500,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"pip install {' '.join(requirements)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
            )


#: What the fresh environment must not see of the runner's: verl's packages (and their editable hooks), and
#: pip (the environment has its own). Path files are not linked: they only act inside a site directory.
_NOT_SHARED = ("verl", "__editable__", "pip")


def share_runner_packages(env_path: Path, shared: Path) -> None:
    """Link the runner's site-packages entries, minus ``_NOT_SHARED``, into ``shared`` and put it on the
    fresh environment's path (after its own site-packages: what it installs itself wins)."""
    shared.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if entry.name.lower().startswith(_NOT_SHARED) or entry.suffix == ".pth":
            continue
        (shared / entry.name).symlink_to(entry)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    (env_path / "lib" / version / "site-packages" / "runner-packages.pth").write_text(f"{shared}\n")


def write_broken_plugin(root: Path) -> Path:
    """A real, installable plugin package whose module raises on import."""
    package = root / "src" / "verl_broken_plugin"
    package.mkdir(parents=True)
    (root / "pyproject.toml").write_text(BROKEN_PLUGIN_PYPROJECT)
    (package / "__init__.py").write_text(f"raise RuntimeError({BROKEN_PLUGIN_ERROR!r})\n")
    return root


@pytest.fixture(scope="session")
def fresh_venv(tmp_path_factory) -> FreshVenv:
    base = tmp_path_factory.mktemp("fresh-venv")
    env = FreshVenv(path=base / "venv", workdir=base / "work", core_only_probe={}, core_only_report="")
    env.workdir.mkdir()
    venv.EnvBuilder(with_pip=True, clear=True).create(env.path)
    share_runner_packages(env.path, base / "runner-packages")

    # Stage 1: verl-core alone.
    env.pip_install(str(REPO / "packages" / "verl-core"))
    probe = env.run("-c", CORE_ONLY_PROBE)
    assert probe.returncode == 0, probe.stderr
    env.core_only_probe = json.loads(probe.stdout.strip().splitlines()[-1])
    report = env.run("-m", "verl.core")
    assert report.returncode == 0, report.stderr
    env.core_only_report = report.stdout

    # Stage 2: an engine package, one platform package, the vendor example and a broken plugin.
    env.pip_install(
        str(REPO / "packages" / "verl-engines"),
        str(REPO / "packages" / "verl-platform-npu"),
        f"{EXAMPLE}[test]",
        str(write_broken_plugin(base / "broken-plugin")),
    )
    return env


# -- stage 1 --------------------------------------------------------------------------------------------


def test_verl_core_alone_selects_cpu_and_imports_no_vendor_library(fresh_venv):
    probe = fresh_venv.core_only_probe
    assert probe["verl_distributions"] == ["verl-core"]
    assert probe["platform"] == "cpu"
    assert probe["plugins"] == []
    assert probe["vendor_modules"] == []
    assert "selected platform: cpu" in fresh_venv.core_only_report
    assert "plugins (entry-point groups verl.platforms, verl.plugins):\n  (none)" in fresh_venv.core_only_report


# -- stage 2: discovery and reporting -------------------------------------------------------------------


@pytest.fixture(scope="session")
def report(fresh_venv) -> subprocess.CompletedProcess:
    """``python -m verl.core`` with no chip visible and nothing forced."""
    return fresh_venv.run("-m", "verl.core")


def section(report_text: str, title: str) -> list[str]:
    """The lines of one section of the ``python -m verl.core`` report."""
    lines = report_text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    body = []
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        body.append(line.strip())
    return body


def line_of(lines: list[str], pattern: str) -> str:
    found = [line for line in lines if re.search(pattern, line)]
    assert len(found) == 1, f"expected one line matching {pattern!r} in:\n" + "\n".join(lines)
    return found[0]


def test_installed_plugins_are_discovered_with_their_distributions(report):
    assert report.returncode == 0, report.stderr
    out = report.stdout
    assert "selected platform: cpu" in out

    platforms = section(out, "platforms")
    assert [p.split()[0] for p in platforms] == ["npu", "acme", "cpu"]  # by priority; only what is installed
    acme = line_of(platforms, r"^acme ")
    assert "prio=50" in acme and " no " in acme and "vendor=acme" in acme and "device=cpu" in acme
    assert "[verl-acme-xpu]" in acme and "set ACME_XPU_VISIBLE=1" in acme
    npu = line_of(platforms, r"^npu ")
    assert "[verl-platform-npu]" in npu
    assert "torch_npu is not installed: pip install 'verl-platform-npu[npu]'" in npu

    engines = section(out, "training engines")
    acme_engine = line_of(engines, r"^\(model_type='language_model', backend='fsdp', device='cpu', vendor='acme'\)")
    assert acme_engine.endswith(" verl_acme_xpu.engine.AcmeFSDPEngine  [verl-acme-xpu]")
    generic = line_of(engines, r"^\(model_type='language_model', backend='fsdp', device='cpu'\)")
    assert generic.endswith(" verl.engines.fsdp.engine.FSDPEngine  [verl-engines]")

    plugins = section(out, "plugins")
    assert re.search(r"^acme\s+verl_acme_xpu.plugin\s+\[verl-acme-xpu\] loaded$", line_of(plugins, r"^acme "))
    assert line_of(plugins, r"^npu ").endswith("[verl-platform-npu] loaded")
    assert line_of(plugins, r"^engines ").endswith("[verl-engines] loaded")


def test_a_plugin_whose_import_raises_is_reported_by_name_and_the_others_load(report):
    assert report.returncode == 0, report.stderr
    plugins = section(report.stdout, "plugins")
    broken = line_of(plugins, r"^broken ")
    assert "verl_broken_plugin" in broken and "[verl-broken-plugin-example]" in broken
    assert broken.endswith(f"FAILED: RuntimeError: {BROKEN_PLUGIN_ERROR}")
    assert all(line.endswith("loaded") for line in plugins if not line.startswith("broken "))
    warnings = [line for line in report.stderr.splitlines() if "'broken'" in line]
    assert len(warnings) == 1, report.stderr
    assert "from verl-broken-plugin-example" in warnings[0] and BROKEN_PLUGIN_ERROR in warnings[0]


def test_an_external_module_that_raises_is_reported_and_the_installed_plugins_still_work(fresh_venv):
    (fresh_venv.workdir / "acme_dev_tools.py").write_text(
        "raise ImportError('libacme_profiler.so: cannot open shared object file')\n"
    )
    result = fresh_venv.run(
        "-m",
        "verl.core",
        VERL_USE_EXTERNAL_MODULES="acme_dev_tools",
        ACME_XPU_VISIBLE="1",
        PYTHONPATH=str(fresh_venv.workdir),
    )
    assert result.returncode == 0, result.stderr
    assert "selected platform: acme" in result.stdout
    plugins = section(result.stdout, "plugins")
    external = line_of(plugins, r"^acme_dev_tools ")
    assert "[<external>]" in external
    assert external.endswith("FAILED: ImportError: libacme_profiler.so: cannot open shared object file")
    assert line_of(plugins, r"^acme ").endswith("loaded")


# -- stage 2: selection and engine lookup ---------------------------------------------------------------

SELECTION_PROBE = """
import json, os
from verl.core.engine import EngineRegistry
from verl.core.platform import get_platform, reset_platform

SCENARIOS = {
    "nothing visible": {},
    "acme visible": {"ACME_XPU_VISIBLE": "1"},
    "acme forced and visible": {"VERL_PLATFORM": "acme", "ACME_XPU_VISIBLE": "1"},
    "acme forced, not visible": {"VERL_PLATFORM": "acme"},
    "cpu platform, acme engines asked for": {"VERL_ENGINE_VENDOR": "acme"},
}
results = {}
for name, env in SCENARIOS.items():
    for key in ("ACME_XPU_VISIBLE", "VERL_PLATFORM", "VERL_ENGINE_VENDOR"):
        os.environ.pop(key, None)
    os.environ.update(env)
    reset_platform()
    try:
        platform = get_platform().name
        engine = EngineRegistry.get(model_type="language_model", backend="fsdp")
        results[name] = {"platform": platform, "engine": f"{engine.__module__}.{engine.__qualname__}"}
    except Exception as exc:
        results[name] = {"error": f"{type(exc).__name__}: {exc}"}
print(json.dumps(results))
"""

ACME_ENGINE = "verl_acme_xpu.engine.AcmeFSDPEngine"
GENERIC_ENGINE = "verl.engines.fsdp.engine.FSDPEngine"


@pytest.fixture(scope="session")
def selection(fresh_venv) -> dict:
    result = fresh_venv.run("-c", SELECTION_PROBE)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_vendor_platform_is_auto_selected_when_visible_and_selected_when_forced(selection):
    assert selection["nothing visible"]["platform"] == "cpu"
    assert selection["acme visible"]["platform"] == "acme"
    assert selection["acme forced and visible"]["platform"] == "acme"
    error = selection["acme forced, not visible"]["error"]
    assert error.startswith("PlatformNotAvailableError: VERL_PLATFORM='acme' was requested but is not available")
    assert "set ACME_XPU_VISIBLE=1" in error


def test_the_vendor_engine_wins_on_its_platform_and_the_generic_engine_elsewhere(selection):
    assert selection["acme visible"]["engine"] == ACME_ENGINE
    assert selection["acme forced and visible"]["engine"] == ACME_ENGINE
    assert selection["nothing visible"]["engine"] == GENERIC_ENGINE
    # VERL_ENGINE_VENDOR overrides the key the (cpu) platform gives.
    assert selection["cpu platform, acme engines asked for"] == {"platform": "cpu", "engine": ACME_ENGINE}


def test_the_example_plugin_passes_its_own_tests_in_the_fresh_environment(fresh_venv):
    # What a vendor runs: the plugin's test suite against installed verl packages (real FSDP2 on a tiny model).
    result = fresh_venv.run("-m", "pytest", "-q", "-p", "no:cacheprovider", "tests", cwd=EXAMPLE)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-3000:]
    assert re.search(r"\b5 passed\b", result.stdout), result.stdout


PLATFORM_ONLY_PROBE = """
import json, sys
from verl.core.platform import get_platform
platform = get_platform()
print(json.dumps({
    "platform": platform.name,
    "imported": sorted(m for m in sys.modules if m.startswith(("verl.engines", "verl_acme_xpu", "verl_broken"))),
}))
"""


def test_a_platform_lookup_imports_the_platform_plugins_only(fresh_venv):
    """Choosing a device imports the ``verl.platforms`` modules (the Acme platform module), never the
    engines of ``verl.plugins`` (verl-engines, the Acme engine) nor a broken plugin of that group."""
    result = fresh_venv.run("-c", PLATFORM_ONLY_PROBE, ACME_XPU_VISIBLE="1")
    assert result.returncode == 0, result.stderr
    probe = json.loads(result.stdout.strip().splitlines()[-1])
    assert probe == {"platform": "acme", "imported": ["verl_acme_xpu", "verl_acme_xpu.platform"]}
