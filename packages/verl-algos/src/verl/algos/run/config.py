"""The run loop's settings: the ``trainer`` keys that every trainer (``verl train``, ``verl sft``) reads
the same way. Each trainer's section extends :class:`RunLoopConfig` and changes only its defaults or adds
its own keys."""

from __future__ import annotations

from dataclasses import dataclass, field

from verl.core.checks import check_choice, check_positive, check_positive_fields

LOGGERS = ("console", "file", "tensorboard", "wandb", "mlflow")


def check_freq(key: str, value: int) -> None:
    """verl's step frequencies: every N steps (N > 0), or never (-1; verl treats 0 the same)."""
    if value < -1:
        raise ValueError(f"{key}={value} has no meaning: use a positive number of steps, or -1 for never")


@dataclass
class RunLoopConfig:
    project_name: str = "verl"
    experiment_name: str = "run"
    logger: list[str] = field(default_factory=lambda: ["console", "file"])
    total_epochs: int = 1
    #: Stop after this many steps (None: run total_epochs).
    total_training_steps: int | None = None
    nnodes: int = 1
    #: Worker processes per node (devices per node on accelerators).
    n_gpus_per_node: int = 1
    #: Checkpoint every N steps and at the last step (-1: never).
    save_freq: int = -1
    test_freq: int = -1
    resume_mode: str = "auto"
    resume_from_path: str | None = None
    default_local_dir: str = "outputs/${trainer.project_name}/${trainer.experiment_name}"
    #: With resume_mode=disable (or auto), in a folder that holds another run's checkpoints: move them, the
    #: latest file and metrics.jsonl into <default_local_dir>/earlier_run_<time>/ and start fresh (nothing is
    #: deleted). Without it such a run is refused, since it would overwrite and rotate away those checkpoints.
    start_over: bool = False
    ray_address: str | None = None
    #: Start the local Ray's dashboard (it listens on 127.0.0.1 unless ray_expose). Anyone who reaches it
    #: can see the cluster and, through its job API, run code as this user; Ray's token guards it.
    ray_include_dashboard: bool = False
    #: Let the local Ray listen on all interfaces (its dashboard too, when on) instead of 127.0.0.1 only:
    #: anyone who reaches its ports with its token can run code as this user. Trusted networks only.
    ray_expose: bool = False
    seed: int = 42
    #: Write a PNG of the main curves at the end of a run.
    plot_curves: bool = False
    #: Seconds a worker call may go without an answer before the run stops with WorkerTimeoutError (a hung
    #: worker or collective); a dead worker stops the run as soon as Ray notices, whatever this is.
    worker_timeout_s: float = 1800.0

    def __post_init__(self) -> None:
        if isinstance(self.logger, str):
            self.logger = [self.logger]
        for backend in self.logger:
            check_choice("logger", backend, LOGGERS)
        if self.resume_mode not in ("auto", "disable", "resume_path") and not self.resume_mode.startswith(
            ("/", ".", "~")
        ):
            raise ValueError(
                f"resume_mode={self.resume_mode!r}: use auto, disable, or a path to a global_step_N folder"
            )
        check_positive_fields(self, "nnodes", "n_gpus_per_node", "total_epochs", "total_training_steps")
        check_freq("save_freq", self.save_freq)
        check_freq("test_freq", self.test_freq)
        check_positive("worker_timeout_s", self.worker_timeout_s)
