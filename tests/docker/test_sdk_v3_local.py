"""The SageMaker Python SDK v3 (`sagemaker>=3`) local container mode against the image under test.

`ModelTrainer(training_mode=Mode.LOCAL_CONTAINER)` WITHOUT source code runs the image as SageMaker runs a
bring-your-own image: its own ENTRYPOINT and CMD (`train`, the toolkit), config files written by the SDK, one
container per host through docker compose, `model.tar.gz` packed from /opt/ml/model. v2 and v3 are the same
PyPI name, so this runs only from a venv with v3 (`pip install 'sagemaker>=3,<4'`, ~3 minutes); the default
`./build.sh test` venv has v2 and skips it:

    python3 -m venv /tmp/v3 && /tmp/v3/bin/pip install pytest pyyaml 'docker>=7.1,<8' 'sagemaker>=3,<4'
    YOLOV5_SMDDP_IMAGE=<image> /tmp/v3/bin/python -m pytest -m docker tests/docker/test_sdk_v3_local.py
"""

from __future__ import annotations

import os
import shutil
import tarfile
import threading
import time
from pathlib import Path

import pytest

sagemaker_train = pytest.importorskip(
    "sagemaker.train", reason="SageMaker Python SDK v3 (sagemaker>=3) is not installed"
)

from sagemaker.train import ModelTrainer  # noqa: E402
from sagemaker.train.configs import Compute, SourceCode  # noqa: E402
from sagemaker.train.distributed import Torchrun  # noqa: E402
from sagemaker.train.model_trainer import Mode  # noqa: E402

from tests.docker.conftest import REPO, TINY_HPS  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.slow]
TRAIN_TIMEOUT_S = 1200


@pytest.fixture
def no_aws(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-west-2")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAFAKEFAKEFAKEFAKE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "fake-secret-for-local-mode")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.delenv("AWS_PROFILE", raising=False)


def _remove_compose_containers(client, root: Path) -> None:
    for container in client.containers.list(all=True, filters={"label": "com.docker.compose.project"}):
        if container.labels.get("com.docker.compose.project.working_dir", "").startswith(str(root)):
            container.remove(force=True)


@pytest.mark.parametrize(
    ("instance_count", "torchrun", "launched_by"),
    [
        (1, False, "launch: single, 1 host(s)"),
        (2, False, "launch: elastic, 2 host(s) x 1 worker(s)"),
        (2, True, "Executing command: torchrun --nnodes=2 --nproc_per_node=1 --master_addr=algo-1"),
    ],
    ids=["1-instance", "2-instances-our-launcher", "2-instances-torchrun-source-code"],
)
def test_sdk_v3_local_container_mode_trains(
    client, image, tmp_path, capfd, no_aws, instance_count, torchrun, launched_by
):
    """Without source code the image's own `train` runs (the toolkit, then our launcher). With source code and
    `Torchrun()` (what job.model_trainer_kwargs builds) the SDK runs its own driver script in the image instead
    (`bash -c sm_train.sh`: neither our ENTRYPOINT nor the toolkit), which starts torchrun on entrypoint.py."""
    root = tmp_path / "v3"
    root.mkdir()
    kwargs = {}
    if torchrun:
        code = tmp_path / "code"
        code.mkdir()
        shutil.copy(REPO / "entrypoint.py", code / "entrypoint.py")
        kwargs = {
            "source_code": SourceCode(source_dir=str(code), entry_script="entrypoint.py"),
            "distributed": Torchrun(),
        }
    trainer = ModelTrainer(
        training_mode=Mode.LOCAL_CONTAINER,
        training_image=image,
        role="arn:aws:iam::111111111111:role/LocalModeNeedsNoRole",
        compute=Compute(instance_type="local_cpu", instance_count=instance_count),
        hyperparameters=dict(TINY_HPS),
        local_container_root=str(root),
        base_job_name="yolov5-smddp-v3-test",
        **kwargs,
    )
    outcome: dict[str, object] = {}

    def train() -> None:
        try:
            trainer.train(wait=True, logs=True)
        except Exception as exc:  # reported below with the job's output
            outcome["error"] = exc

    start = time.monotonic()
    thread = threading.Thread(target=train, daemon=True)
    thread.start()
    thread.join(TRAIN_TIMEOUT_S)
    timed_out = thread.is_alive()
    if timed_out:
        _remove_compose_containers(client, root)  # ends docker compose, and with it train()
        thread.join(120)
    _remove_compose_containers(client, root)
    captured = capfd.readouterr()
    log = captured.out + captured.err
    (tmp_path / "train.log").write_text(log)
    print(f"[sdk v3 local container] {instance_count} instance(s): {time.monotonic() - start:.0f} s")
    assert not timed_out, f"train() did not end within {TRAIN_TIMEOUT_S} s:\n{log[-6000:]}"
    assert "error" not in outcome, f"train() failed: {outcome['error']}\n{log[-6000:]}"
    assert f"world_size={instance_count}" in log, log[-6000:]
    assert launched_by in log, log[-6000:]
    tarball = root / "compressed_artifacts" / "model.tar.gz"
    assert tarball.is_file(), sorted(os.listdir(root))
    with tarfile.open(tarball) as tar:
        assert "best.pt" in tar.getnames()
