"""Which failures are known problems — the input or the job's storage must change — and the exit code of
every failure: the one classification the failure file (sagemaker/failure.py), the commands run directly
(cli.py) and the elastic workers (launch.py) share. Pure: nothing is written here."""

from __future__ import annotations

import errno

from yolov5_smddp.errors import OutputError, UserError, output_error
from yolov5_smddp.train.out_of_memory import as_memory_problem

EXIT_USER_ERROR = 2
EXIT_INTERNAL_ERROR = 1


WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS)
"""OS errors that only a write raises: an OSError of these reaching the top is an output problem even
where no atomic_write turned it into an OutputError (a library writing its own file)."""


def as_output_error(exc: BaseException) -> OutputError | None:
    """`exc` as the OutputError it stands for: itself, or an OSError only a write raises (with its
    file name); None otherwise."""
    if isinstance(exc, OutputError):
        return exc
    if isinstance(exc, OSError) and exc.errno in WRITE_ERRNOS and exc.filename:
        return output_error(exc, exc.filename)
    return None


def known(exc: BaseException) -> BaseException:
    """`exc`, or the MemoryExhausted it stands for (a memory problem reported in any shape)."""
    return as_memory_problem(exc) or exc


def exit_code(exc: BaseException) -> int:
    """The process exit code for a failure (pure; the contract is in sagemaker/failure.py's docstring)."""
    if isinstance(exc, SystemExit) and isinstance(exc.code, int):
        return exc.code
    worker_code = getattr(exc, "exitcode", 0)
    if isinstance(worker_code, int) and worker_code > 0:
        return worker_code
    if isinstance(known(exc), UserError) or as_output_error(exc) is not None:
        return EXIT_USER_ERROR
    return EXIT_INTERNAL_ERROR


def is_known_problem(exc: BaseException) -> bool:
    """A bad input or an output that cannot be written: reported in one line, no traceback."""
    return isinstance(known(exc), UserError) or as_output_error(exc) is not None


def error_line(exc: BaseException) -> str:
    """The one `error:` line of a known problem (is_known_problem)."""
    problem = as_output_error(exc) or known(exc)
    return "error: " + " ".join(str(problem).split())
