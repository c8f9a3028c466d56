"""One container: the real SageMaker toolkit path, plain `docker run IMAGE train`, failures, SIGTERM."""

from __future__ import annotations

import json
import re
import stat
from pathlib import Path

import pytest
from stopping import model_files, stopped_model_files

from tests.docker.conftest import TINY_HPS, opt_ml_mounts, opt_ml_tree
from tests.docker.engine import Engine, bind, logs, wait_for_log

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def test_toolkit_train_with_mounted_opt_ml(image: str, dataset: Path, tmp_path: Path, engine: Engine):
    """SageMaker's way: `docker run IMAGE train` with a mounted config (read-only: our ENTRYPOINT must not
    touch it) and a read-only training channel holding a stale release-format cache."""
    root = opt_ml_tree(tmp_path / "ml", host="algo-1", hosts=["algo-1"], hps=TINY_HPS, channels=("training",))
    before = (root / "input" / "config" / "hyperparameters.json").read_text()
    run = engine.run(image, "train", hostname="algo-1", mounts=opt_ml_mounts(root, {"training": dataset}))
    log = run.log
    assert run.code == 0, log[-4000:]
    assert "Invoking user training script" in log  # the real toolkit ran our program
    assert "wrote a single-host config" not in log
    assert (root / "input" / "config" / "hyperparameters.json").read_text() == before
    assert "labels/train.cache: release-format label cache ignored" in log
    assert (root / "model" / "best.pt").is_file()
    assert (root / "output" / "success").is_file() and not (root / "output" / "failure").exists()
    assert (root / "output" / "data" / "results.csv").is_file()
    # caches, the rebased data.yaml: nothing under output/intermediate, which SageMaker uploads
    assert not [p for p in (root / "output" / "intermediate").rglob("*") if p.is_file()]


def test_plain_docker_run_train_trains_on_the_embedded_dataset(image: str, tmp_path: Path, engine: Engine):
    """No config mounted: our ENTRYPOINT writes a local single-host config from the arguments. The output
    folders mounted as `./build.sh run` does, with its YOLOV5_SMDDP_OWNER: at the end everything in them
    belongs to that (non-root) user, files 0644 and folders 0755, so the person who ran it can open them."""
    folders = {name: tmp_path / name for name in ("model", "output", "checkpoints")}
    for folder in folders.values():
        folder.mkdir()
    model = folders["model"]
    args = [w for k, v in TINY_HPS.items() for w in (f"--{k}", v)]
    args += ["--tensorboard-dir", "/opt/ml/output/tensorboard"]  # the image carries the tensorboard package
    mounts = [bind(folder, f"/opt/ml/{name}") for name, folder in folders.items()]
    run = engine.run(image, ["train", *args], mounts=mounts, environment={"YOLOV5_SMDDP_OWNER": "4321:4322"})
    log = run.log
    assert run.code == 0, log[-4000:]
    assert "wrote a single-host config" in log
    assert "launch: single" in log
    assert (model / "best.pt").is_file() and (model / "metrics.json").is_file()
    # the serving files: TorchScript, and ONNX (the image carries the onnx package)
    assert (model / "best.torchscript").is_file() and (model / "best.onnx").is_file(), sorted(model.iterdir())
    # a clean log: no tracer warning from the export, no font cache built at run time (the image has it)
    assert "TracerWarning" not in log and "fontManager" not in log and "font cache" not in log
    assert "output files and folders handed back to 4321:4322" in log
    assert list((folders["output"] / "tensorboard").glob("events.out.tfevents.*")), log[-4000:]
    assert "tensorboard package is not installed" not in log
    written = [p for folder in folders.values() for p in folder.rglob("*")]
    assert len(written) > 10 and (folders["output"] / "data" / "results.csv") in written
    for path in [*folders.values(), *written]:
        info = path.lstat()
        assert (info.st_uid, info.st_gid) == (4321, 4322), path
        assert stat.S_IMODE(info.st_mode) == (0o755 if path.is_dir() else 0o644), (path, oct(info.st_mode))


def test_bad_dataset_fails_with_a_clear_reason(image: str, tmp_path: Path, engine: Engine):
    channel = tmp_path / "channel"
    (channel / "images").mkdir(parents=True)
    (channel / "data.yaml").write_text(
        "path: /somewhere/else\ntrain: images/train2017\nval: images/val2017\nnames: [a]\n"
    )
    root = opt_ml_tree(tmp_path / "ml", host="algo-1", hosts=["algo-1"], hps=TINY_HPS, channels=("training",))
    run = engine.run(image, "train", hostname="algo-1", mounts=opt_ml_mounts(root, {"training": channel}))
    assert run.code != 0
    reason = (root / "output" / "failure").read_text()[:1024]
    first = reason.splitlines()[0]
    assert first.startswith("Dataset problem: ")
    assert "/opt/ml/input/data/training/images/train2017" in first and "'train'" in first
    # a known problem is one `error:` line naming the folder (its traceback only at debug level: issue 42)
    assert "Traceback" not in run.log, run.log[-3000:]
    assert any(
        "error: " in line and "images/train2017 does not exist" in line for line in run.log.splitlines()
    )
    assert not (root / "model" / "best.pt").exists()


def test_a_small_dev_shm_trains_in_the_main_process_and_says_why(image: str, tmp_path: Path, engine: Engine):
    """A real 1 MiB /dev/shm (docker run --shm-size 1m) cannot carry one 8 x 3 x 256 x 256 batch from a loader
    worker: the job plans no workers up front (data/shm_budget.py, issue 50), says so in one line naming
    --shm-size, and trains to the end instead of failing or hanging in a worker."""
    output = tmp_path / "output"
    output.mkdir()
    hps = {**TINY_HPS, "imgsz": "256", "workers": "2"}
    args = [w for k, v in hps.items() for w in (f"--{k}", v)]
    run = engine.run(image, ["train", *args], shm_size="1m", mounts=[bind(output, "/opt/ml/output")])
    assert run.code == 0, run.log[-3000:]
    [said] = [line for line in run.log.splitlines() if "/dev/shm has " in line]
    assert "loading in the main process (no workers, slower)" in said, said
    assert "docker run --shm-size 1g" in said, said
    assert not (output / "failure").exists()
    assert "LoaderWorkerDied" not in run.log and "Traceback" not in run.log


def test_unknown_hyperparameter_stops_the_job_before_any_work(image: str, tmp_path: Path, engine: Engine):
    root = opt_ml_tree(tmp_path / "ml", host="algo-1", hosts=["algo-1"], hps={**TINY_HPS, "epochz": "3"})
    run = engine.run(image, "train", hostname="algo-1", mounts=opt_ml_mounts(root, {}))
    assert run.code != 0
    first = (root / "output" / "failure").read_text().splitlines()[0]
    assert first.startswith("Invalid hyperparameter or option: ") and "--epochz" in first


def stop_mid_training(engine: Engine, image: str, root: Path, dataset: Path) -> str:
    """Start the job of the /opt/ml tree `root`, `docker stop -t 120` it (StopTrainingJob, max_run, a spot
    interruption: SIGTERM, SIGKILL 120 s later) once epoch 1 is validated and epoch 2 under way, and check
    what every stopped job must show: it ended within the window, exiting as a stopped job does under the
    toolkit (1, its code for any failed program; entrypoint.py's own 143 is in the log), said so in one
    line, without a traceback and without blaming memory for its loader workers, and left a checkpoint and
    a complete model folder. Returns the log."""
    job = engine.start(image, "train", hostname="algo-1", mounts=opt_ml_mounts(root, {"training": dataset}))
    wait_for_log(job, "epoch=2 step=1 ", timeout=600)
    job.stop(timeout=120)
    job.reload()
    state = job.attrs["State"]
    log = logs(job)
    assert state["ExitCode"] == 1 and not state["OOMKilled"], log[-4000:]
    assert "Encountered exit_code 1" in log and "ExitCode 143" in log  # the toolkit's report of our 143
    assert "SIGTERM received" in log
    assert "Traceback" not in log and "LoaderWorkerDied" not in log and "/dev/shm" not in log, log[-6000:]
    assert len([line for line in log.splitlines() if "STOPPED: " in line]) == 1, log[-4000:]
    assert (root / "checkpoints" / "last.pt").is_file(), log[-4000:]
    failure = (root / "output" / "failure").read_text()
    assert failure.startswith("Training was stopped by SIGTERM") and "Traceback" not in failure
    model = root / "model"
    files = model_files(model)
    assert files == stopped_model_files("torchscript"), files  # the SMDDP stand-in's torch 2.6
    metrics = json.loads((model / "metrics.json").read_text())
    assert metrics["interrupted"] is True and metrics["weights_from"] == "best", metrics
    assert re.fullmatch(r"(in|after) epoch \d+", metrics["stopped"]) and metrics["epochs"] >= 1, metrics
    return log


def test_sigterm_leaves_a_model_folder_and_a_resumable_checkpoint(
    image: str, dataset: Path, tmp_path: Path, engine: Engine
):
    """A stopped job with loader workers (see stop_mid_training): its best.pt predicts, and the same job
    again resumes from its checkpoint."""
    hps = {**TINY_HPS, "epochs": "50", "workers": "2"}
    root = opt_ml_tree(tmp_path / "ml", host="algo-1", hosts=["algo-1"], hps=hps, channels=("training",))
    log = stop_mid_training(engine, image, root, dataset)
    model = root / "model"
    # best.pt loads and predicts, in a second container
    image_file = sorted((dataset / "images" / "val").iterdir())[0]
    out = tmp_path / "predicted"
    out.mkdir()
    predicted = engine.run(
        image,
        ["predict", "--weights", "/opt/ml/model/best.pt", "--source", f"/d/images/val/{image_file.name}"]
        + ["--out", "/out", "--imgsz", "64", "--conf", "0.001"],
        entrypoint="yolov5-smddp",
        mounts=[bind(model, "/opt/ml/model", read_only=True), bind(dataset, "/d", read_only=True)]
        + [bind(out, "/out")],
    )
    assert predicted.code == 0, predicted.log[-4000:]
    answer = json.loads((out / f"{image_file.stem}.json").read_text())
    assert answer["width"] > 0 and isinstance(answer["detections"], list), answer

    # the same job again (as a restarted spot job), shortened to end one epoch after the interrupted one:
    # it resumes from /opt/ml/checkpoints. SIGTERM during an epoch's steps restarts that epoch ("in epoch E");
    # during its validation the epoch's checkpoint stands and the next one follows ("after epoch E").
    stopped = re.search(r"interrupted (?:in|after) epoch (\d+)", log)
    assert stopped, log[-4000:]
    interrupted = int(stopped.group(1))
    (root / "input" / "config" / "hyperparameters.json").write_text(
        json.dumps({**hps, "epochs": str(interrupted + 1)})
    )
    (root / "output" / "failure").unlink()
    run = engine.run(image, "train", hostname="algo-1", mounts=opt_ml_mounts(root, {"training": dataset}))
    log = run.log
    assert run.code == 0, log[-4000:]
    assert "resuming from /opt/ml/checkpoints/last.pt" in log
    assert (root / "model" / "best.pt").is_file()


def test_sigterm_stops_two_ranks_under_the_elastic_launcher(
    image: str, dataset: Path, tmp_path: Path, engine: Engine
):
    """Two ranks on one host (the entrypoint's own elastic launcher, gloo), loader workers on each: the
    agent waits for its ranks, rank 0 writes the model folder while rank 1 waits, nobody hangs."""
    hps = {**TINY_HPS, "epochs": "50", "workers": "1", "nproc-per-node": "2", "batch-size": "4"}
    root = opt_ml_tree(tmp_path / "ml", host="algo-1", hosts=["algo-1"], hps=hps, channels=("training",))
    log = stop_mid_training(engine, image, root, dataset)
    assert "launch: elastic, 1 host(s) x 2 worker(s)" in log
    assert json.loads((root / "model" / "config.json").read_text())["world_size"] == 2
