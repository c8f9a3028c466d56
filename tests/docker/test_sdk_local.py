"""The real SageMaker Python SDK v2 in local mode, as a user drives it, against the image under test.

`PyTorch(..., instance_type="local").fit()` with a `LocalSession` (local_code) writes /opt/ml/input/config for
each host, starts one container per host with docker compose, and packs /opt/ml/model into model.tar.gz under
the file:// output path: the contract SageMaker uses. One run per SDK configuration of issue 16 (1 host; 2 hosts
with our launcher; 2 hosts with the SMDDP distribution = the toolkit's mpirun over ssh; 2 hosts with
torch_distributed = the toolkit's torchrun), one with a `training` channel holding a release-format
labels.cache, one whose `training` channel is images + a COCO JSON, and one fine-tuning from the release's
yolov5n.pt given as a `weights` channel. No AWS: fake credentials, a region, telemetry opted out (the SDK's TelemetryOptOut default).

Not tested here, because local mode cannot do it: a spot-style restart. The SDK refuses checkpoint_s3_uri and
checkpoint_local_path in local mode ("not supported in local mode"), mounts no /opt/ml/checkpoints, has no
StopTrainingJob, and every fit() starts from a new temporary /opt/ml: nothing survives into a second run.
SIGTERM and resume are covered by tests/docker/test_container.py and test_cluster.py on the same image.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sagemaker = pytest.importorskip(
    "sagemaker", reason="the SageMaker Python SDK is not installed (./build.sh test)"
)
if int(sagemaker.__version__.split(".")[0]) >= 3:
    pytest.skip(
        f"these tests drive SDK v2 (sagemaker<3); found {sagemaker.__version__}", allow_module_level=True
    )

from docker.errors import DockerException  # noqa: E402
from sagemaker.local import LocalSession  # noqa: E402
from sagemaker.pytorch import PyTorch  # noqa: E402

from tests.docker.conftest import REPO, TINY_HPS  # noqa: E402
from yolov5_smddp.client.job import OBJECTIVE_METRIC  # noqa: E402
from yolov5_smddp.telemetry import METRIC_DEFINITIONS  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.slow]

LOCAL_NETWORK = "sagemaker-local"
FIT_TIMEOUT_S = 1200  # the SMDDP row took 561 s on a 2-core machine at load 18
METRIC_REGEXES = {d["Name"]: d["Regex"] for d in METRIC_DEFINITIONS}
SMDDP = {"smdistributed": {"dataparallel": {"enabled": True}}}
TORCH_DISTRIBUTED = {"torch_distributed": {"enabled": True}}
# SDK defaults (its config schema): no telemetry call to AWS; also keeps the user's config files out.
MPIRUN_LAUNCH = r"launch: mpirun, 2 host\(s\) x 1 worker\(s\)"
SDK_CONFIG = {"SchemaVersion": "1.0", "SageMaker": {"PythonSDK": {"Modules": {"TelemetryOptOut": True}}}}


@pytest.fixture
def no_aws(monkeypatch: pytest.MonkeyPatch) -> None:
    """A region and fake credentials (the SDK and boto3 need them; nothing is called with them), and the
    compose tool local mode runs: `docker compose` v2, else `docker-compose` (the SDK's own choice)."""
    try:
        v2 = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True, timeout=60)
        has_compose = "v2" in v2.stdout
    except (OSError, subprocess.TimeoutExpired):
        has_compose = False
    if not has_compose and shutil.which("docker-compose") is None:
        pytest.skip("SDK local mode needs `docker compose` (v2) or `docker-compose`; neither is installed")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-west-2")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAFAKEFAKEFAKEFAKE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "fake-secret-for-local-mode")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("SAGEMAKER_SUPPRESS_V2_WARNING", "1")
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "SAGEMAKER_USER_CONFIG_OVERRIDE"):
        monkeypatch.delenv(name, raising=False)


def _compose_containers(client, root: Path) -> list:
    """The containers docker compose made for jobs under `root` (the session's container_root)."""
    found = []
    for container in client.containers.list(all=True, filters={"label": "com.docker.compose.project"}):
        working_dir = container.labels.get("com.docker.compose.project.working_dir", "")
        if working_dir.startswith(str(root)):
            found.append(container)
    return found


def _remove_compose_leftovers(client, root: Path) -> None:
    for container in _compose_containers(client, root):
        container.remove(force=True)


@pytest.fixture(scope="module", autouse=True)
def _local_mode_network(client) -> Iterator[None]:
    """Local mode's compose file names its network `sagemaker-local` and nothing removes it: remove it after
    these tests unless it existed before (a user's) or is still in use (the engine refuses then)."""
    existed = bool(client.networks.list(names=[LOCAL_NETWORK]))
    yield
    if not existed:
        for network in client.networks.list(names=[LOCAL_NETWORK]):
            with contextlib.suppress(DockerException):
                network.remove()


def _sdk_fit(
    client,
    image: str,
    tmp_path: Path,
    capsys,
    *,
    instance_count: int,
    distribution=None,
    inputs=None,
    hyperparameters: dict[str, str | None] | None = None,
):
    """fit() in local mode, bounded: (the job's output, the model.tar.gz member names, seconds).
    `hyperparameters` change TINY_HPS (a None value removes the key)."""
    import boto3

    code = tmp_path / "code"  # what /opt/ml/code becomes: only the program, the package is the image's
    code.mkdir()
    shutil.copy(REPO / "entrypoint.py", code / "entrypoint.py")
    container_root = tmp_path / "sdk"
    container_root.mkdir()
    session = LocalSession(boto_session=boto3.Session(region_name="us-west-2"), sagemaker_config=SDK_CONFIG)
    session.config = {"local": {"local_code": True, "container_root": str(container_root)}}
    kwargs = {"distribution": distribution} if distribution else {}
    estimator = PyTorch(
        entry_point="entrypoint.py",
        source_dir=str(code),
        image_uri=image,
        role="arn:aws:iam::111111111111:role/LocalModeNeedsNoRole",
        instance_type="local",
        instance_count=instance_count,
        hyperparameters={k: v for k, v in {**TINY_HPS, **(hyperparameters or {})}.items() if v is not None},
        output_path=f"file://{tmp_path / 'out'}",
        sagemaker_session=session,
        base_job_name="yolov5-smddp-sdk-test",
        **kwargs,
    )
    outcome: dict[str, object] = {}

    def fit() -> None:
        try:
            estimator.fit(inputs, wait=True, logs=True)
        except Exception as exc:  # reported below with the job's output
            outcome["error"] = exc

    start = time.monotonic()
    thread = threading.Thread(target=fit, daemon=True)
    thread.start()
    thread.join(FIT_TIMEOUT_S)
    timed_out = thread.is_alive()
    if timed_out:  # stopping the containers ends docker compose, and with it fit()
        for container in _compose_containers(client, container_root):
            container.kill()
        thread.join(120)
    seconds = time.monotonic() - start
    _remove_compose_leftovers(client, container_root)
    log = capsys.readouterr().out
    (tmp_path / "fit.log").write_text(log)  # kept with pytest's tmp folders, for a look after a failure
    sys.stderr.write(f"[sdk local mode] {instance_count} instance(s), {distribution}: {seconds:.0f} s\n")
    assert not timed_out, f"fit() did not end within {FIT_TIMEOUT_S} s:\n{log[-6000:]}"
    assert "error" not in outcome, f"fit() failed: {outcome['error']}\n{log[-6000:]}"
    artifacts = estimator.model_data
    assert artifacts.startswith("file://"), artifacts
    with tarfile.open(artifacts[len("file://") :]) as tar:
        members = tar.getnames()
        best = tar.extractfile("best.pt").read() if "best.pt" in members else b""
    return log, members, best, seconds


def _assert_trained(log: str, members: list[str], best: bytes, world_size: int) -> None:
    assert f"world_size={world_size}" in log, log[-6000:]
    assert "best.pt" in members, members
    assert len(best) > 100_000 and best[:2] == b"PK", (
        "best.pt is not a torch zip checkpoint"
    )  # torch.save zip
    assert "use_libuv was requested" not in log
    # Tuning reads the objective from the LAST match of its regex in the job's log: the final metric line
    # (best.pt re-validated, `final=1`, after the last epoch's line; behind mpirun's rank tag where there is
    # one) must carry it.
    metric_lines = [
        line for line in log.splitlines() if any(re.search(r, line) for r in METRIC_REGEXES.values())
    ]
    objective = re.findall(METRIC_REGEXES[OBJECTIVE_METRIC], metric_lines[-1])
    assert len(objective) == 1 and 0.0 <= float(objective[0]) <= 1.0, metric_lines[-3:]
    assert "final=1 " in metric_lines[-1], metric_lines[-3:]
    assert any("epoch=1 epochs=1 " in line for line in metric_lines[:-1]), metric_lines[-3:]


@pytest.mark.parametrize(
    ("instance_count", "distribution", "launched_by"),
    [
        (1, None, (r"launch: ",)),
        (2, None, (r"launch: elastic, 2 host\(s\) x 1 worker\(s\)",)),
        (  # each rank names its own host (the host count from the job's hosts, not Open MPI's local size);
            # local mode names the hosts algo-1-<suffix>, algo-2-<suffix>
            2,
            SMDDP,
            (
                r"mpirun --host algo-1",
                rf"\]<stdout>: {MPIRUN_LAUNCH}, this host algo-1-\w+ \(node 0\), master algo-1-\w+:7777",
                rf"\]<stdout>: {MPIRUN_LAUNCH}, this host algo-2-\w+ \(node 1\), master algo-1-\w+:7777",
            ),
        ),
        (2, TORCH_DISTRIBUTED, (r"torchrun --nnodes 2",)),
    ],
    ids=[
        "1-instance",
        "2-instances-our-launcher",
        "2-instances-smddp-mpirun",
        "2-instances-torch-distributed",
    ],
)
def test_sdk_v2_local_mode_trains(
    client, image, tmp_path, capsys, no_aws, instance_count, distribution, launched_by
):
    log, members, best, _ = _sdk_fit(
        client, image, tmp_path, capsys, instance_count=instance_count, distribution=distribution
    )
    _assert_trained(log, members, best, instance_count)
    for pattern in launched_by:  # regular expressions
        assert re.search(pattern, log), (pattern, log[-6000:])


def test_sdk_v2_local_mode_with_a_training_channel_and_a_release_cache(
    client, image, dataset, tmp_path, capsys, no_aws
):
    """The `training` channel is a file:// folder whose labels/train.cache is the release's (a pickle of
    another machine's paths): the job trains from the channel, ignores that cache and writes nothing into it."""
    before = {p.relative_to(dataset): p.stat().st_mtime_ns for p in dataset.rglob("*")}
    cache = (dataset / "labels" / "train.cache").read_bytes()
    log, members, best, _ = _sdk_fit(
        client, image, tmp_path, capsys, instance_count=1, inputs={"training": f"file://{dataset}"}
    )
    _assert_trained(log, members, best, 1)
    assert "rebased onto channel /opt/ml/input/data/training" in log, log[-6000:]
    assert "labels/train.cache: release-format label cache ignored (it is a pickle, never loaded)" in log
    assert {p.relative_to(dataset): p.stat().st_mtime_ns for p in dataset.rglob("*")} == before
    assert (dataset / "labels" / "train.cache").read_bytes() == cache


def test_sdk_v2_local_mode_with_a_coco_json_training_channel(client, image, engine, tmp_path, capsys, no_aws):
    """The `training` channel is images + one COCO instances JSON, no data.yaml: the job reads the JSON
    as it is (train and val) and writes nothing into the channel."""
    from tests.docker.test_coco import make_coco_channels

    channel = make_coco_channels(engine, image, tmp_path / "coco") / "train"
    before = {p.relative_to(channel): p.stat().st_mtime_ns for p in channel.rglob("*")}
    log, members, best, _ = _sdk_fit(
        client, image, tmp_path, capsys, instance_count=1, inputs={"training": f"file://{channel}"}
    )
    _assert_trained(log, members, best, 1)
    assert "reading its COCO JSON instances.json" in log, log[-6000:]
    assert "dataset check train (/opt/ml/input/data/training/instances.json): 16 images, 16 usable" in log
    assert {p.relative_to(channel): p.stat().st_mtime_ns for p in channel.rglob("*")} == before


RELEASE_YOLOV5N = REPO / "tests" / "fixtures" / "release_models" / "yolov5n.pt"


def test_sdk_v2_local_mode_fine_tunes_from_a_release_checkpoint_in_a_weights_channel(
    client, image, tmp_path, capsys, no_aws
):
    """The pretrained weights as users give them: the release's own pickled yolov5n.pt (COCO's 80 classes)
    in a `weights` channel, and `weights: yolov5n.pt` relative to it; no `cfg`: the checkpoint's
    architecture, its Detect rows for the dataset's classes, the checkpoint's anchors."""
    channel = tmp_path / "weights"
    channel.mkdir()
    shutil.copyfile(RELEASE_YOLOV5N, channel / "yolov5n.pt")
    log, members, best, _ = _sdk_fit(
        client,
        image,
        tmp_path,
        capsys,
        instance_count=1,
        inputs={"weights": f"file://{channel}"},
        hyperparameters={"cfg": None, "weights": "yolov5n.pt"},
    )
    _assert_trained(log, members, best, 1)
    assert "weights: yolov5n.pt from channel /opt/ml/input/data/weights (release)" in log, log[-6000:]
    assert re.search(
        r"model: yolov5n from weights /opt/ml/input/data/weights/yolov5n.pt \(nc 80→\d+, anchors from the "
        r"checkpoint\); transferred \d+/\d+ tensors",
        log,
    ), log[-6000:]
