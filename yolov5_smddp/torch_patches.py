"""The two places where our elastic launcher changes torch's own code, each for one `with` block only.

torch's elastic agent offers no public setting for either, so each is a patch of one module attribute,
restored when the block ends, and applied only after checking that torch still looks the way the patch
assumes (`*_problems()`: the attribute exists, has the signature we call it with, and torch's code still looks
it up by that name). A torch whose surface differs gets torch's own behaviour and one warning line naming
what changed; tests/unit/test_torch_patches.py asserts the surface on the installed torch (and that its
version is one of TESTED_TORCH), so CI turns red on a torch upgrade before a job meets it.

- `agent_waits_after_sigterm(grace_s)`: once the agent has received SIGTERM, it waits `grace_s` for its
  workers (their checkpoint and model folder) instead of torch's 30 s
  (`torch.distributed.elastic.multiprocessing.api`: `_terminate_process_handler`, `PContext.close`).
- `static_store_without_libuv()`: the static rendezvous creates its TCPStore with use_libuv=False; for torch
  builds without libuv (Debian's, in the local stand-in), where it ignores USE_LIBUV and fails at once
  (`torch.distributed.elastic.rendezvous.static_tcp_rendezvous.TCPStore`).
"""

from __future__ import annotations

import inspect
import logging
import signal
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)

TESTED_TORCH = ("2.5", "2.6", "2.10", "2.15")
"""torch releases (major.minor) whose internals these patches were read against: 2.5.1 (the SMDDP DLC), 2.6
(Debian's, the local stand-in), 2.10.0 (the current DLC) and 2.15.0 (the newest on PyPI, 2026-12). Read in
2.10 and 2.15: `_terminate_process_handler(signum, frame)` raises SignalException and `PContext.start`
installs it by its global name; the agent's SIGTERM path calls `_shutdown(sigval)` (2.10) or
`_shutdown(sigval, timeout=self._shutdown_timeout)` (2.15, LaunchConfig.shutdown_timeout, 30 s by default),
and both reach `PContext.close(death_sig, timeout)`, which now also stops its tail logs and filtered
streams after `_close` (the patch calls the original, so those still run); `StaticTCPRendezvous.
next_rendezvous` still builds `TCPStore(...)` by the module's name without use_libuv. Add a release only
after reading its code behind each `*_problems()`."""

CLOSE_PARAMETERS = ("self", "death_sig", "timeout")
HANDLER_PARAMETERS = ("signum", "frame")


def _parameters(function: object) -> tuple[str, ...] | None:
    try:
        return tuple(inspect.signature(function).parameters)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def _looks_up(function: object, name: str) -> bool:
    """Whether `function`'s code reads the global (or attribute) `name` when it runs."""
    code = getattr(function, "__code__", None)
    return code is not None and name in code.co_names


def _signature_problem(name: str, function: object, expected: tuple[str, ...]) -> list[str]:
    found = _parameters(function)
    if found == expected:
        return []
    if found is None:
        return [f"{name} is missing"]
    return [f"{name} takes ({', '.join(found)}), not ({', '.join(expected)})"]


def stop_window_problems() -> list[str]:
    """What in torch differs from what `agent_waits_after_sigterm` patches (empty: nothing)."""
    from torch.distributed.elastic.multiprocessing import api

    problems = _signature_problem(
        "api._terminate_process_handler", getattr(api, "_terminate_process_handler", None), HANDLER_PARAMETERS
    )
    if not _looks_up(getattr(api.PContext, "start", None), "_terminate_process_handler"):
        problems.append("PContext.start no longer installs api._terminate_process_handler")
    problems += _signature_problem("PContext.close", getattr(api.PContext, "close", None), CLOSE_PARAMETERS)
    return problems


def static_store_problems() -> list[str]:
    """What in torch differs from what `static_store_without_libuv` patches (empty: nothing)."""
    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous import static_tcp_rendezvous

    problems = []
    if getattr(static_tcp_rendezvous, "TCPStore", None) is not TCPStore:
        problems.append("static_tcp_rendezvous.TCPStore is not torch.distributed.TCPStore")
    if not _looks_up(static_tcp_rendezvous.StaticTCPRendezvous.next_rendezvous, "TCPStore"):
        problems.append("StaticTCPRendezvous.next_rendezvous no longer creates its store as TCPStore(...)")
    if "use_libuv" not in (TCPStore.__doc__ or ""):  # the class documents its constructor's arguments
        problems.append("TCPStore takes no use_libuv argument")
    return problems


def _warn(what: str, problems: list[str], consequence: str) -> None:
    import torch

    log.warning(
        "torch %s changed under yolov5_smddp (%s: %s): %s",
        torch.__version__,
        what,
        "; ".join(problems),
        consequence,
    )


@contextmanager
def agent_waits_after_sigterm(grace_s: float) -> Iterator[None]:
    """Inside the block, torch's elastic agent, once it has received SIGTERM itself, waits up to `grace_s`
    for its workers before SIGKILL. A shutdown after a failed worker keeps torch's timeout (30 s)."""
    problems = stop_window_problems()
    if problems:
        _warn("the agent's stop window", problems, "workers get torch's own 30 s after a SIGTERM")
        yield
        return
    from torch.distributed.elastic.multiprocessing import api

    original_handler, original_close = api._terminate_process_handler, api.PContext.close
    received: list[int] = []

    def handler(signum, frame) -> None:
        received.append(signum)
        original_handler(signum, frame)

    def close(self, death_sig=None, timeout: int = 30) -> None:
        if signal.SIGTERM in received:
            timeout = max(timeout, grace_s)
        original_close(self, death_sig, timeout)

    api._terminate_process_handler, api.PContext.close = handler, close
    try:
        yield
    finally:
        api._terminate_process_handler, api.PContext.close = original_handler, original_close


@contextmanager
def static_store_without_libuv() -> Iterator[None]:
    """Inside the block, the static rendezvous creates its TCPStore with use_libuv=False."""
    problems = static_store_problems()
    if problems:
        _warn("the static rendezvous store", problems, "its TCPStore keeps torch's libuv default")
        yield
        return
    from torch.distributed.elastic.rendezvous import static_tcp_rendezvous

    store_class = static_tcp_rendezvous.TCPStore

    def tcp_store(*args, **kwargs):
        kwargs.setdefault("use_libuv", False)
        return store_class(*args, **kwargs)

    static_tcp_rendezvous.TCPStore = tcp_store
    try:
        yield
    finally:
        static_tcp_rendezvous.TCPStore = store_class
