"""The exit contract of a SageMaker job: 0 on success; otherwise a one-paragraph reason at the top of
/opt/ml/output/failure (SageMaker shows its first 1024 characters as the job's FailureReason), the full
traceback in the log, and a non-zero exit code:

- 143 (EXIT_INTERRUPTED) after SIGTERM (StopTrainingJob, spot interruption, max_run): the checkpoint and
  the model folder are written; one line in the log and the reason in the failure file, no traceback
  (`report_stop`). Under the SageMaker toolkit the container itself then exits 1 (the toolkit's code for
  any failed program),
- a worker's own exit code when one failed (WorkerFailed),
- SystemExit's integer code (argparse: 2),
- 2 (EXIT_USER_ERROR) for a UserError (bad option, dataset, weights): the input must change,
- 1 (EXIT_INTERNAL_ERROR) for anything else.
"""

from __future__ import annotations

import logging
import traceback
from pathlib import Path

from yolov5_smddp.atomic import atomic_write
from yolov5_smddp.errors import EXIT_INTERRUPTED, ConfigError, DataError, UserError
from yolov5_smddp.launch import WorkerFailed

log = logging.getLogger(__name__)

FAILURE_REASON_CHARS = 1024
EXIT_USER_ERROR = 2
EXIT_INTERNAL_ERROR = 1


def failure_reason(exc: BaseException) -> str:
    """One paragraph for /opt/ml/output/failure: what failed, which file/value, what to do."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, WorkerFailed):
        return f"Training failed: {text}. The worker's full traceback is in the job's log (CloudWatch)."
    if isinstance(exc, UserError):
        kind = {ConfigError: "Invalid hyperparameter or option", DataError: "Dataset problem"}.get(
            type(exc), "Invalid input"
        )
        return f"{kind}: {text}"
    return (
        f"Training failed with {type(exc).__name__}: {text}. This is not a known input problem; "
        "the full traceback is in the job's log (CloudWatch)."
    )


def exit_code(exc: BaseException) -> int:
    """The process exit code for a failure (pure; see the module docstring)."""
    if isinstance(exc, SystemExit) and isinstance(exc.code, int):
        return exc.code
    worker_code = getattr(exc, "exitcode", 0)
    if isinstance(worker_code, int) and worker_code > 0:
        return worker_code
    return EXIT_USER_ERROR if isinstance(exc, UserError) else EXIT_INTERNAL_ERROR


def write_failure(path: Path, reason: str, details: str = "") -> None:
    """Reason first (SageMaker reads the first 1024 characters), then the details."""
    body = reason.strip() + "\n"
    if details:
        body += "\n" + details
    with atomic_write(path, "w", encoding="utf-8") as handle:
        handle.write(body)


def report_failure(exc: BaseException, failure_file: Path) -> int:
    """Log the traceback and the reason, write the failure file, return the exit code.
    Call it from an `except` block (it formats the exception being handled)."""
    details = traceback.format_exc()
    log.error("%s", details)
    reason = failure_reason(exc)
    log.error("FAILURE: %s", reason)
    try:
        write_failure(failure_file, reason, details)
    except OSError as write_exc:
        log.error("could not write %s: %s", failure_file, write_exc)
    return exit_code(exc)


def report_stop(reason: str, failure_file: Path) -> int:
    """A stop by SIGTERM, which is no failure of the program: one line in the log (no traceback), the
    reason in the failure file; returns EXIT_INTERRUPTED."""
    log.warning("STOPPED: %s", reason)
    try:
        write_failure(failure_file, reason)
    except OSError as write_exc:
        log.error("could not write %s: %s", failure_file, write_exc)
    return EXIT_INTERRUPTED
