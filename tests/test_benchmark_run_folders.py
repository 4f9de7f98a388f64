"""The benchmarks' training runs never share a folder with an earlier invocation's: ``verl train`` resumes
from and appends to its folder, which once mixed an old run's steps into a new table."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from common import runs_folder  # noqa: E402
from runners import fresh_run_folder  # noqa: E402


def test_each_invocation_gets_its_own_runs_folder(tmp_path):
    first = runs_folder(tmp_path, "e2e_runs")
    fresh_run_folder(str(first / "verl-hf-0"))
    second = runs_folder(tmp_path, "e2e_runs")  # the same second: still a new folder
    assert second != first and not second.exists()
    assert first.parent == second.parent == tmp_path / "e2e_runs"


def test_a_folder_holding_a_run_is_refused_and_left_as_it_was(tmp_path):
    folder = tmp_path / "verl-hf-0"
    assert fresh_run_folder(str(folder)) == folder and folder.is_dir()  # new, or empty: taken
    (folder / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(FileExistsError, match="already holds a run"):
        fresh_run_folder(str(folder))
    assert (folder / "metrics.jsonl").read_text() == '{"step": 1}\n'
