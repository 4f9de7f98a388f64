"""Every tracking backend, for real: files on disk, TensorBoard event files read back, wandb in offline
mode and mlflow with a local file store."""

import json
import os

import pytest

from verl.algos.tracking import RunInfo, Tracking, plot_curves, read_metrics
from verl.core.registry import RegistryError

STEPS = [
    {"critic/score/mean": 0.25, "val/acc": 0.4, "actor/pg_loss": 0.1, "timing_s/step": 2.0, "val/mean@4": 0.5},
    {"critic/score/mean": 0.5, "actor/pg_loss": float("nan"), "timing_s/step": 1.5},
    {"critic/score/mean": 0.75, "val/acc": 0.6, "actor/pg_loss": 0.05, "timing_s/step": 1.4},
]


def run_info(tmp_path) -> RunInfo:
    return RunInfo(
        project="proj", experiment="exp", local_dir=str(tmp_path / "run"), config={"a": {"b": 1}}, total_steps=3
    )


def log_all(tracking: Tracking) -> None:
    for step, metrics in enumerate(STEPS, start=1):
        tracking.log(metrics, step)
    tracking.finish()


def test_file_tracker_writes_one_json_per_step_and_appends_on_resume(tmp_path):
    info = run_info(tmp_path)
    log_all(Tracking(["file"], info))
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3]
    assert json.loads(lines[1])["actor/pg_loss"] == "nan"
    resumed = Tracking(["file"], info)  # a resumed run re-logs step 3 and continues
    resumed.log({"critic/score/mean": 0.8}, 3)
    resumed.log({"critic/score/mean": 0.9}, 4)
    resumed.finish()
    records = read_metrics(info.local_dir)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert records[2]["critic/score/mean"] == 0.8


def test_a_line_torn_by_a_kill_is_cut_when_the_run_resumes(tmp_path):
    info = run_info(tmp_path)
    log_all(Tracking(["file"], info))
    path = tmp_path / "run" / "metrics.jsonl"
    with open(path, "a") as fh:
        fh.write('{"step": 4, "critic/score/me')  # killed in the middle of a write
    resumed = Tracking(["file"], info)
    resumed.log({"critic/score/mean": 0.9}, 4)
    resumed.finish()
    assert [r["step"] for r in read_metrics(info.local_dir)] == [1, 2, 3, 4]
    assert all(json.loads(line) for line in path.read_text().splitlines())


def test_console_tracker_prints_key_metrics(tmp_path, capsys):
    log_all(Tracking(["console"], run_info(tmp_path)))
    captured = capsys.readouterr()
    assert "step 1: critic/score/mean=0.25 val/acc=0.4" in captured.out  # metric lines on stdout
    assert "step 3:" in captured.out
    assert "3/3" in captured.err  # the progress bar on stderr


def test_tensorboard_event_files_hold_the_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    info = run_info(tmp_path)
    log_all(Tracking(["tensorboard"], info))
    acc = EventAccumulator(os.path.join(info.local_dir, "tensorboard"))
    acc.Reload()
    scores = [(e.step, e.value) for e in acc.Scalars("critic/score/mean")]
    assert scores == [(1, 0.25), (2, 0.5), (3, 0.75)]


def test_wandb_offline_run_is_written(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    info = run_info(tmp_path)
    log_all(Tracking(["wandb"], info))
    run_dirs = list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert len(run_dirs) == 1
    assert list(run_dirs[0].glob("*.wandb")), "no offline run file written"


def test_mlflow_local_store_records_metrics(tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    info = run_info(tmp_path)
    log_all(Tracking(["mlflow"], info))
    from verl.algos.tracking.mlflow_backend import local_store_uri

    client = mlflow.tracking.MlflowClient(tracking_uri=local_store_uri(info.local_dir))
    experiment = client.get_experiment_by_name("proj")
    (run,) = client.search_runs([experiment.experiment_id])
    history = client.get_metric_history(run.info.run_id, "critic/score/mean")
    assert [(m.step, m.value) for m in history] == [(1, 0.25), (2, 0.5), (3, 0.75)]
    assert run.data.params["a.b"] == "1"
    assert client.get_metric_history(run.info.run_id, "val/mean_4")[0].value == 0.5


def test_unknown_backend_names_the_valid_ones(tmp_path):
    with pytest.raises(RegistryError, match="'tensorboard'"):
        Tracking(["tensorbord"], run_info(tmp_path))


def test_plot_curves_writes_a_png(tmp_path):
    info = run_info(tmp_path)
    log_all(Tracking(["file"], info))
    path = plot_curves(info.local_dir)
    assert path is not None and path.endswith("curves.png")
    with open(path, "rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
    assert plot_curves(str(tmp_path / "empty")) is None
