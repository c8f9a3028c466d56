"""The exit contract of a SageMaker job: 0 on success; otherwise a one-paragraph reason at the top of
/opt/ml/output/failure (SageMaker shows its first 1024 characters as the job's FailureReason), the full
traceback in the log, and a non-zero exit code:

- 143 (EXIT_INTERRUPTED) after SIGTERM (StopTrainingJob, spot interruption, max_run): the checkpoint and
  the model folder are written; one line in the log and the reason in the failure file, no traceback
  (`report_stop`). Under the SageMaker toolkit the container itself then exits 1 (the toolkit's code for
  any failed program),
- a worker's own exit code when one failed (WorkerFailed),
- SystemExit's integer code (argparse: 2),
- 2 (EXIT_USER_ERROR) for memory exhaustion (out_of_memory: MemoryError, oneDNN's "could not create a
  primitive", CUDA out of memory; one line naming memory and what to change), for a UserError (bad option, dataset, weights) and for an output that cannot be
  written (OutputError, or an OSError such as ENOSPC: a full disk, a read-only folder): the input or the
  job's storage must change; one `error:` line in the log, no traceback (it goes to the debug log),
- 1 (EXIT_INTERNAL_ERROR) for anything else.

`train`/`val`/`predict`/`export` run directly (yolov5_smddp.cli) report through `report_command_failure`:
the same one line, and the failure file too where the SageMaker output folder is there
(`command_failure_file`).
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Mapping
from pathlib import Path

from yolov5_smddp.errors import (
    EXIT_INTERRUPTED,
    ConfigError,
    DataError,
    UserError,
    WorkerFailed,
)
from yolov5_smddp.files.atomic import atomic_write
from yolov5_smddp.problems import (
    as_output_error,
    error_line,
    exit_code,
    is_known_problem,
    known,
)
from yolov5_smddp.sagemaker.env import default_failure_file

log = logging.getLogger(__name__)

FULL_DISK_ADVICE = "raise volume_size (the job's storage volume, in GB) or write less into it"
FULL_DISK_MARKS = ("no space left on ", "disk quota exceeded on ")
"""OutputError causes for a full disk, as the worker's recorded error text carries them too."""


def _full_disk_advice(text: str) -> str:
    return f": {FULL_DISK_ADVICE}" if any(mark in text for mark in FULL_DISK_MARKS) else ""


FAILURE_REASON_CHARS = 1024


def failure_reason(exc: BaseException) -> str:
    """One paragraph for /opt/ml/output/failure: what failed, which file/value, what to do."""
    exc = exc if isinstance(exc, WorkerFailed) else known(exc)
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, WorkerFailed):
        return (
            f"Training failed: {text}{_full_disk_advice(text)}. "
            "The worker's full traceback is in the job's log (CloudWatch)."
        )
    written = as_output_error(exc)
    if written is not None:
        return f"Output problem: {written.cause}{_full_disk_advice(written.cause)} (writing {written.path})"
    if isinstance(exc, UserError):
        kind = {ConfigError: "Invalid hyperparameter or option", DataError: "Dataset problem"}.get(
            type(exc),
            getattr(
                exc, "kind", "Invalid input"
            ),  # out_of_memory's MemoryExhausted / OutOfMemory: "Out of memory"
        )
        return f"{kind}: {text}"
    return (
        f"Training failed with {type(exc).__name__}: {text}. This is not a known input problem; "
        "the full traceback is in the job's log (CloudWatch)."
    )


def write_failure(path: Path, reason: str, details: str = "") -> None:
    """Reason first (SageMaker reads the first 1024 characters), then the details."""
    body = reason.strip() + "\n"
    if details:
        body += "\n" + details
    with atomic_write(path, "w", encoding="utf-8") as handle:
        handle.write(body)


def report_failure(exc: BaseException, failure_file: Path | None) -> int:
    """Log the failure, write the failure file (unless None), return the exit code. A known problem
    (is_known_problem) is one `error:` line (its traceback at debug level) and the reason alone in the
    file; anything else logs the traceback and puts it in the file after the reason.
    Call it from an `except` block (it formats the exception being handled)."""
    details = traceback.format_exc()
    if is_known_problem(exc):
        log.debug("%s", details)
        log.error("%s", error_line(exc))
        details = ""
    else:
        log.error("%s", details)
    reason = failure_reason(exc)
    log.error("FAILURE: %s", reason)
    if failure_file is not None:
        try:
            write_failure(failure_file, reason, details)
        except (OSError, UserError) as write_exc:
            log.error("could not write %s: %s", failure_file, write_exc)
    return exit_code(exc)


def command_failure_file(environ: Mapping[str, str]) -> Path | None:
    """Where a command run directly (`yolov5-smddp train|val|predict|export`) writes its failure file:
    /opt/ml/output/failure (under $SAGEMAKER_BASE_DIR) when that output folder exists (a SageMaker
    container), else None (a laptop: the `error:` line alone)."""
    failure_file = default_failure_file(environ)
    return failure_file if failure_file.parent.is_dir() else None


def report_stop(reason: str, failure_file: Path) -> int:
    """A stop by SIGTERM, which is no failure of the program: one line in the log (no traceback), the
    reason in the failure file; returns EXIT_INTERRUPTED."""
    log.warning("STOPPED: %s", reason)
    try:
        write_failure(failure_file, reason)
    except (OSError, UserError) as write_exc:
        log.error("could not write %s: %s", failure_file, write_exc)
    return EXIT_INTERRUPTED
