"""A run's log file, ``<trainer.default_local_dir>/train.log``: kept when a run stops, with the error and its
traceback (the console gets the one-line message; see ``cli``).

A full disk while writing the log stops the run as a full disk while writing a checkpoint does: with
:class:`RunFolderDiskFullError` naming the file, the last complete checkpoint and what to do. (Only on the
main thread, where the trainer runs; a record a background thread could not write is dropped, and the next
record of the trainer, or the metrics, meets the full disk.) Once the disk was full the file gets no more
records, so the error is raised once and the stop itself can still be reported on the console.
"""

from __future__ import annotations

import logging
import os
import threading

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

logger = logging.getLogger("verl.train")


class RunLogHandler(logging.FileHandler):
    def __init__(self, path: str, run_folder: str):
        super().__init__(path)
        self.run_folder = run_folder
        self.disk_full = False

    def emit(self, record: logging.LogRecord) -> None:
        from verl.algos.run.checkpoint_layout import close_unflushable, disk_full_error, is_disk_full

        if self.disk_full:
            return
        try:
            self.stream.write(self.format(record) + self.terminator)
            self.flush()
        except OSError as exc:
            if not is_disk_full(exc):
                self.handleError(record)
                return
            if threading.current_thread() is not threading.main_thread():
                return  # dropped; the trainer's next record meets the full disk and stops the run
            self.disk_full = True
            stream, self.stream = self.stream, None
            close_unflushable(stream)
            raise disk_full_error(self.run_folder, f"the run's log {self.baseFilename}") from exc
        except Exception:
            self.handleError(record)

    def close(self) -> None:
        if self.disk_full:
            logging.Handler.close(self)
            return
        super().close()


def log_to_run_folder(local_dir: str, name: str = "train.log") -> RunLogHandler:
    os.makedirs(local_dir, exist_ok=True)
    path = os.path.abspath(os.path.join(local_dir, name))
    root = logging.getLogger()
    for handler in root.handlers:  # one handler per file, also when runs repeat in one process
        if isinstance(handler, RunLogHandler) and handler.baseFilename == path and not handler.disk_full:
            return handler
    handler = RunLogHandler(path, local_dir)
    handler.setFormatter(logging.Formatter(FORMAT))
    root.addHandler(handler)
    return handler


def note_failure(handler: RunLogHandler, exc: BaseException, kept: str) -> None:
    """Add ``kept`` (what survives and how to go on) to ``exc``'s notes, and write the error with its
    traceback to the run's log only: the console shows the one-line message the CLI prints."""
    exc.add_note(kept)
    record = logger.makeRecord(
        logger.name,
        logging.ERROR,
        __file__,
        0,
        "the run stopped on an error; the last complete checkpoint and the logs in %s are kept",
        (handler.run_folder,),
        (type(exc), exc, exc.__traceback__),
    )
    try:
        handler.handle(record)
    except OSError:
        pass  # the disk is full: the error itself says so
