"""The ``verl`` command.

    verl train [-r RECIPE] [key.path=value ...]     RL training (default: GRPO on the embedded task)
    verl sft [key.path=value ...]                   supervised fine-tuning on the same engines
    verl eval MODEL_OR_CHECKPOINT [key=value ...]   score a model or checkpoint on a dataset
    verl export CHECKPOINT_DIR OUTPUT_DIR [--overwrite] [--adapter-only]  a checkpoint to a Hugging Face folder
                                                      (a new or empty one); LoRA: merged, or the PEFT adapter
    verl platforms                                  platforms, engines and plugins, and which is selected
    verl config show [-r RECIPE] [key=value ...]    the resolved config
    verl recipes                                    the built-in recipes

Config errors are reported before Ray starts, naming the key and the nearest valid ones.

Exit status: 0 done; 1 an error (one line saying what happened and what to do; the traceback is in the run's
train.log, or shown with -v); 2 a config error; 3 a worker fault (a worker process died or hung, after
trainer.max_restarts restarts; the message names its role, rank and node); 130 interrupted. A run never ends 0
unless it did what was asked: user code that calls sys.exit() (of any code) or raises KeyboardInterrupt
inside a run ends it with 1 and names the file and line. The last complete checkpoint and the logs are kept
whenever a run stops.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import traceback

from verl.core.config import ConfigError

EXIT_CONFIG_ERROR = 2
EXIT_WORKER_FAULT = 3
EXIT_INTERRUPTED = 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="verl", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    train = sub.add_parser("train", help="RL training (PPO, GRPO, DAPO, ...)")
    train.add_argument(
        "-r", "--recipe", default=None, help="recipe name (see `verl recipes`) or a YAML file; default grpo"
    )
    _add_hydra_flags(train)
    train.add_argument("overrides", nargs="*", metavar="key.path=value")

    sft = sub.add_parser("sft", help="supervised fine-tuning")
    sft.add_argument("overrides", nargs="*", metavar="key.path=value")

    ev = sub.add_parser("eval", help="score a model folder or a checkpoint on a dataset")
    ev.add_argument(
        "model", help="a Hugging Face folder, a built-in model name, or a global_step_<N> checkpoint folder"
    )
    ev.add_argument("-r", "--recipe", default=None)
    ev.add_argument("overrides", nargs="*", metavar="key.path=value")

    export = sub.add_parser("export", help="write a checkpoint as a Hugging Face folder")
    export.add_argument("checkpoint_dir", help="a global_step_<N> folder (or its actor/ subfolder)")
    export.add_argument("output_dir", help="a new or empty folder (see --overwrite)")
    export.add_argument(
        "--overwrite",
        action="store_true",
        help="replace what output_dir holds (never a folder that holds the checkpoint, nor one inside it)",
    )
    export.add_argument(
        "--adapter-only",
        action="store_true",
        help="LoRA checkpoints: write the PEFT adapter folder instead of the merged model",
    )

    sub.add_parser("platforms", help="platforms, engines, plugins")
    sub.add_parser("recipes", help="list built-in recipes")

    config = sub.add_parser("config", help="configuration")
    config_sub = config.add_subparsers(dest="config_command", metavar="SUBCOMMAND")
    show = config_sub.add_parser("show", help="print the resolved config")
    show.add_argument("-r", "--recipe", default=None)
    _add_hydra_flags(show)
    show.add_argument("overrides", nargs="*", metavar="key.path=value")
    return parser


def _add_hydra_flags(parser: argparse.ArgumentParser) -> None:
    """verl's run scripts pick a Hydra config (``--config-path=... --config-name=...``)."""
    parser.add_argument("--config-path", "-cp", default=None, help="with --config-name: a folder of verl YAML configs")
    parser.add_argument(
        "--config-name", "-cn", default=None, help="verl's ppo_trainer (the default) or a YAML in --config-path"
    )


class _OneLineExceptions(logging.Formatter):
    """Console records show an exception as its one-line message; the run's train.log has the traceback."""

    def formatException(self, ei) -> str:  # noqa: N802 (logging's name)
        return f"{ei[0].__name__}: {ei[1]} (traceback in the run's train.log, or run with -v)"


_sigint_received = False


def _on_sigint(signum, frame) -> None:
    """Ctrl-C: remember that it was a real interrupt (a KeyboardInterrupt raised by user code is not one)."""
    global _sigint_received
    _sigint_received = True
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    global _sigint_received
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    if not args.verbose:
        for handler in logging.getLogger().handlers:
            if type(handler) is logging.StreamHandler:
                handler.setFormatter(_OneLineExceptions(handler.formatter._fmt, handler.formatter.datefmt))
    command = args.command or "train"
    if args.command is None:  # `verl` alone runs the main job
        args.recipe, args.overrides = None, []
    _sigint_received = False
    previous = signal.signal(signal.SIGINT, _on_sigint) if _on_main_thread() else None
    try:
        return _dispatch(command, args)
    except ConfigError as exc:
        print(f"verl: config error: {exc}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    except KeyboardInterrupt as exc:
        if not _sigint_received:  # raised by code, not by Ctrl-C: it did not stop on the user's request
            print(f"verl: stopped: KeyboardInterrupt raised by {_origin(exc)} (no Ctrl-C was pressed)", file=sys.stderr)
            _print_notes(exc)
            return 1
        print("verl: interrupted; the last complete checkpoint and the logs are kept", file=sys.stderr)
        return EXIT_INTERRUPTED
    except SystemExit as exc:  # verl's commands return their status: this came from user or library code
        print(
            f"verl: stopped: {_origin(exc)} called sys.exit({exc.code!r}) in the middle of `verl {command}`, "
            "which did not finish",
            file=sys.stderr,
        )
        _print_notes(exc)
        return 1
    except Exception as exc:
        if _is_worker_fault(exc):
            _print_stop("worker fault", exc)
            return EXIT_WORKER_FAULT
        if _is_explained(exc):  # the message says what happened and what to do; the traceback is in train.log
            _print_stop(type(exc).__name__, exc)
            return 1
        if args.verbose:
            raise
        _print_stop(f"error: {type(exc).__name__}", exc)
        if command not in ("train", "sft", "eval"):  # runs name their train.log in a note
            print("verl: run again with -v to see the traceback", file=sys.stderr)
        return 1
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def _on_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _origin(exc: BaseException) -> str:
    """``file:line`` where ``exc`` was raised (the innermost frame of its traceback)."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "code"
    return f"{frames[-1].filename}:{frames[-1].lineno}"


def _print_stop(kind: str, exc: Exception) -> None:
    # an OSError's str() leads with "[Errno N]"; its strerror is the message itself
    message = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
    print(f"verl: {kind}: {message}", file=sys.stderr)
    _print_notes(exc)


def _print_notes(exc: BaseException) -> None:
    for note in getattr(exc, "__notes__", ()):
        print(f"verl: {note}", file=sys.stderr)


def _is_worker_fault(exc: Exception) -> bool:
    """A worker process died or hung: the run's inputs may be fine, so a scheduler may retry the job."""
    from verl.core.controller import WorkerDiedError, WorkerTimeoutError

    return isinstance(exc, (WorkerDiedError, WorkerTimeoutError))


def _is_explained(exc: Exception) -> bool:
    """Run-time stops whose message names the cause and the fix: a full disk, a damaged or non-finite
    checkpoint, a run folder that another run holds or whose files are not this run's, non-finite numbers, a
    broken reward function."""
    from verl.algos.rewards import RewardFunctionError, RewardSetupError
    from verl.algos.run.checkpoint_layout import (
        CheckpointIntegrityError,
        CheckpointNonFiniteError,
        CheckpointOwnershipError,
        RunFolderDiskFullError,
    )
    from verl.algos.run.folder_lock import RunFolderBusyError
    from verl.algos.run.nonfinite import NonFiniteError
    from verl.algos.trainer.export import ExportTargetError

    explained = (
        RunFolderDiskFullError,
        CheckpointIntegrityError,
        CheckpointNonFiniteError,
        CheckpointOwnershipError,
        ExportTargetError,
        NonFiniteError,
        RewardFunctionError,
        RewardSetupError,
        RunFolderBusyError,
    )
    return isinstance(exc, explained)


def _dispatch(command: str, args: argparse.Namespace) -> int:
    if command == "platforms":
        from verl.core.report import platform_report

        print(platform_report())
        return 0
    if command == "recipes":
        from verl.algos.config import recipe_names, recipe_path

        for name in recipe_names():
            first = recipe_path(name).read_text().splitlines()[0].lstrip("# ")
            print(f"{name:<22} {first}")
        return 0
    if command == "config":
        if args.config_command != "show":
            print("usage: verl config show [-r RECIPE] [key.path=value ...]", file=sys.stderr)
            return 2
        from verl.algos.config import hydra_recipe
        from verl.algos.trainer.main import show_config

        return show_config(hydra_recipe(args.recipe, args.config_path, args.config_name), args.overrides)
    if command == "train":
        from verl.algos.config import hydra_recipe
        from verl.algos.trainer.main import train

        return train(hydra_recipe(args.recipe, args.config_path, args.config_name), args.overrides)
    if command == "sft":
        from verl.algos.trainer.sft_main import sft

        return sft(args.overrides)
    if command == "eval":
        from verl.algos.trainer.main import evaluate

        return evaluate(args.model, args.recipe, args.overrides)
    if command == "export":
        from verl.algos.trainer.export import export_checkpoint

        print(
            export_checkpoint(
                args.checkpoint_dir, args.output_dir, overwrite=args.overwrite, adapter_only=args.adapter_only
            )
        )
        return 0
    raise ConfigError(f"unknown command {command!r}")


if __name__ == "__main__":
    sys.exit(main())
