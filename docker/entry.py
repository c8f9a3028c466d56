#!/usr/bin/env python3
"""The image's ENTRYPOINT: a thin layer in front of the base image's own entrypoint.

- `train` with no SageMaker config mounted (plain `docker run IMAGE train [--epochs 3 ...]`): writes a
  single-host /opt/ml/input/config (resourceconfig, hyperparameters from the arguments, inputdataconfig for
  the folders mounted under /opt/ml/input/data), so that the real toolkit's `train` runs the job instead of
  exiting 0 having done nothing.
- `train` with a config present (SageMaker, local mode, a mounted tree): nothing is written or changed.
- Either way the base image's entrypoint then runs the command exactly as it would without this layer.
- With `-e YOLOV5_SMDDP_OWNER=UID:GID` (`./build.sh run` passes the caller's), what the job wrote under
  /opt/ml/{model,output,checkpoints} is handed back to that host user when it ends (sagemaker/handback.py);
  SageMaker never sets it.

As PID 1 it also passes SIGTERM/SIGINT (StopTrainingJob, spot interruption, `docker stop`) on to the
training processes — the toolkit does not forward signals to its program — so the trainer can write its
checkpoint before SageMaker's SIGKILL 120 s later. The toolkit itself and the base entrypoint's shell are
spared: the toolkit relays the program's output and reports its exit code, and killing it would cut the
program's stdout.
"""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time

BASE_ENTRYPOINT = os.environ.get(
    "YOLOV5_SMDDP_BASE_ENTRYPOINT", "/usr/local/bin/start_with_right_hostname.sh"
)
AFTER_SIGNAL_WAIT_S = 115.0


def base_command(args: list[str]) -> list[str]:
    """The base image's ENTRYPOINT + CMD (the DLC's `bash -m start_with_right_hostname.sh`), or the args."""
    if os.path.isfile(BASE_ENTRYPOINT):
        return ["bash", "-m", BASE_ENTRYPOINT, *args]
    return args


def prepare_train(args: list[str]) -> list[str]:
    from yolov5_smddp.errors import UserError
    from yolov5_smddp.sagemaker.local_config import write_local_config

    try:
        written = write_local_config(os.environ, args[1:], hostname=socket.gethostname())
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    if written is not None:
        print(
            f"[yolov5-smddp] no SageMaker config mounted: wrote a single-host config in {written}", flush=True
        )
    elif len(args) > 1:
        print(
            f"[yolov5-smddp] a SageMaker config is present: ignoring the arguments {args[1:]} "
            "(hyperparameters come from hyperparameters.json)",
            file=sys.stderr,
            flush=True,
        )
    return ["train"]


def training_processes(spared: set[int]) -> list[int]:
    """Pids in this container other than PID 1, `spared`, and the toolkit's `train` processes."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in spared or int(entry) in (1, os.getpid()):
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        except OSError:
            continue  # gone already
        if not argv or any(os.path.basename(a) == "train" for a in argv[:2]):
            continue
        pids.append(int(entry))
    return pids


def supervise(command: list[str]) -> int:
    """Run `command`, forward termination signals, and return its exit code (128 + signal if killed)."""
    child = subprocess.Popen(command, start_new_session=os.getpid() != 1)
    signalled: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        signalled.append(signum)
        if os.getpid() != 1:  # e.g. under `docker run --init`: the best we can do is our process group
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signum)
            return
        for pid in training_processes({child.pid}):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    code = child.wait()
    if signalled and os.getpid() == 1:
        # processes that outlived their parent are ours now: let them finish their checkpoint
        deadline = time.monotonic() + AFTER_SIGNAL_WAIT_S
        while time.monotonic() < deadline:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                time.sleep(0.2)
    return 128 - code if code < 0 else code


def requested_owner():
    """The host user ($YOLOV5_SMDDP_OWNER=UID:GID) to hand the output folders back to, or None; a bad
    value stops here, before any work."""
    from yolov5_smddp.errors import UserError
    from yolov5_smddp.sagemaker.handback import requested_owner as parse

    try:
        return parse(os.environ)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


def hand_back_outputs(owner) -> None:
    """Give what the job wrote under /opt/ml/{model,output,checkpoints} to `owner` (see handback)."""
    from yolov5_smddp.sagemaker.handback import hand_back, output_folders

    changed, failed = hand_back(output_folders(os.environ), owner)
    note = f"; {failed} could not be changed" if failed else ""
    print(
        f"[yolov5-smddp] output files and folders handed back to {owner.uid}:{owner.gid}: {changed}{note}",
        flush=True,
    )


def main() -> int:
    args = sys.argv[1:]
    owner = requested_owner()
    if args[:1] == ["train"]:
        args = prepare_train(args)
    code = supervise(base_command(args))
    if owner is not None:
        hand_back_outputs(owner)
    return code


if __name__ == "__main__":
    sys.exit(main())
