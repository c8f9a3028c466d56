#!/usr/bin/env python3
"""The image's ENTRYPOINT: a thin layer in front of the base image's own entrypoint.

- `train` with no SageMaker config mounted (plain `docker run IMAGE train [--epochs 3 ...]`): writes a
  single-host /opt/ml/input/config (resourceconfig, hyperparameters from the arguments, inputdataconfig for
  the folders mounted under /opt/ml/input/data), so that the real toolkit's `train` runs the job instead of
  exiting 0 having done nothing.
- `train` with a config present (SageMaker, local mode, a mounted tree): nothing is written or changed;
  arguments beside it (a job's ContainerArguments) are refused with a failure reason and exit 2, since
  the job's options are its hyperparameters and training with something else than asked loses the job.
- Either way the base image's entrypoint then runs the command exactly as it would without this layer.
- With `-e YOLOV5_SMDDP_OWNER=UID:GID` (`./build.sh run` passes the caller's), what the job wrote under
  /opt/ml/{model,output,checkpoints} is handed back to that host user when it ends (sagemaker/handback.py);
  SageMaker never sets it.

As PID 1 it also passes SIGTERM/SIGINT (StopTrainingJob, spot interruption, max_run, `docker stop`) on to
the training processes — the toolkit does not forward signals to its program — so the trainer can write its
checkpoint and the model folder before SageMaker's SIGKILL 120 s later. Spared (`RELAYS`): the toolkit and
the base entrypoint's shell (the toolkit relays the program's output and reports its exit code; killing it
would cut the program's stdout), and the launchers between the toolkit and the ranks (mpirun/orted,
smddprun, torchrun, sshd): each would turn the signal into a SIGKILL of its ranks after its own short
grace (Open MPI seconds, torchrun 30 s), while the ranks here get the signal directly anyway. DataLoader
workers get it too and ignore it (yolov5_smddp.data.loader): their trainer ends them.
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
        refuse_container_arguments(args[1:])
    return ["train"]


def refuse_container_arguments(extra: list[str]) -> None:
    """A job with a SageMaker config that also got container arguments (the API's ContainerArguments, or
    options after `train`): they are not the job's hyperparameters, and training with something else than
    asked is worse than not training. One line on stderr, the failure file, exit 2."""
    from yolov5_smddp.problems import EXIT_USER_ERROR
    from yolov5_smddp.sagemaker.env import default_failure_file
    from yolov5_smddp.sagemaker.failure import write_failure

    reason = (
        f"Invalid hyperparameter or option: the container got the arguments {extra} (ContainerArguments) "
        "beside a SageMaker config; this image takes a job's options only as hyperparameters "
        "(hyperparameters.json), so it refuses to train with something else than asked: pass them as "
        'hyperparameters (e.g. {"epochs": 3}) and leave ContainerArguments unset'
    )
    print(f"error: {reason}", file=sys.stderr, flush=True)
    try:
        write_failure(default_failure_file(os.environ), reason)
    except OSError as exc:
        print(f"[yolov5-smddp] failure file not written: {exc}", file=sys.stderr, flush=True)
    sys.exit(EXIT_USER_ERROR)


def sagemaker_config_present() -> bool:
    from yolov5_smddp.sagemaker.env import base_dir

    return (base_dir(os.environ) / "input" / "config" / "resourceconfig.json").exists()


RELAYS = frozenset(
    {"train", "mpirun", "mpiexec", "orterun", "prterun", "orted", "prted", "smddprun", "torchrun", "sshd"}
)
"""Programs that start or relay the training processes (see the module docstring): never signalled."""


def is_relay(argv: list[str]) -> bool:
    """Whether the process with command line `argv` is one of RELAYS (as the program or the script an
    interpreter runs: `python3 /usr/local/bin/torchrun ...`), or has no command line (a kernel thread)."""
    return (
        not argv
        or any(os.path.basename(a) in RELAYS for a in argv[:2])
        or argv[1:3] == ["-m", "torch.distributed.run"]  # torchrun spelled as a module
    )


def training_processes(spared: set[int]) -> list[int]:
    """Pids in this container other than PID 1, `spared`, and RELAYS."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in spared or int(entry) in (1, os.getpid()):
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        except OSError:
            continue  # gone already
        if is_relay(argv):
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
    if args[:1] == ["serve"]:  # SageMaker's inference contract: `docker run IMAGE serve`, HTTP on 8080
        from yolov5_smddp.serving import server

        return server.main(args[1:])
    owner = requested_owner()
    if args[:1] == ["train"]:
        args = prepare_train(args)
    elif args[:1] and args[0].startswith("-") and sagemaker_config_present():
        refuse_container_arguments(args)  # ContainerArguments replace `train` itself: options, no command
    code = supervise(base_command(args))
    if owner is not None:
        hand_back_outputs(owner)
    return code


if __name__ == "__main__":
    sys.exit(main())
