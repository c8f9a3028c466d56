import importlib.util
import io
import json
import sys
import tarfile
from pathlib import Path

import pytest

from yolov5_smddp.client.job import JobSpec
from yolov5_smddp.errors import ConfigError, DataError

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "scaling_sweep.py"


@pytest.fixture(scope="module")
def sweep():
    spec = importlib.util.spec_from_file_location("scaling_sweep", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["scaling_sweep"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    yield module
    del sys.modules["scaling_sweep"]


BASE = JobSpec(
    image_uri="123.dkr.ecr.us-west-2.amazonaws.com/yolov5-smddp:1",
    role="arn:aws:iam::123:role/R",
    hyperparameters={"cfg": "yolov5x", "epochs": 3, "batch-size": 256},
    metric_definitions=[{"Name": "m", "Regex": "m=(\\S+)"}],
)


def tar_bytes(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_sweep_points_product_sorted(sweep):
    points = sweep.sweep_points([2, 1], [8], [48, 32])
    assert [(p.nodes, p.workers, p.batch_per_gpu) for p in points] == [
        (1, 8, 32),
        (1, 8, 48),
        (2, 8, 32),
        (2, 8, 48),
    ]


def test_sweep_points_reject_zero_nodes(sweep):
    with pytest.raises(ConfigError, match="nodes"):
        sweep.sweep_points([0], [8], [32])


def test_base_job_name_fits_and_is_clean(sweep):
    point = sweep.SweepPoint(nodes=8, workers=12, batch_per_gpu=48)
    assert sweep.base_job_name("yolov5_sweep", point) == "yolov5-sweep-n8-w12-b48"
    long_name = sweep.base_job_name("a" * 80, point)
    assert len(long_name) == 32 and long_name.endswith("-n8-w12-b48")


def test_estimator_kwargs_per_point(sweep):
    points = sweep.sweep_points([1, 4], [12], [32])
    kwargs = sweep.sweep_estimator_kwargs(BASE, points)
    assert [k["instance_count"] for k in kwargs] == [1, 4]
    assert kwargs[1]["hyperparameters"] == {
        "cfg": "yolov5x",
        "epochs": "3",
        "batch-per-gpu": "32",
        "workers": "12",
    }
    assert kwargs[1]["base_job_name"] == "yolov5-smddp-n4-w12-b32"
    assert kwargs[1]["distribution"] == {"smdistributed": {"dataparallel": {"enabled": True}}}
    assert kwargs[1]["image_uri"] == BASE.image_uri and kwargs[1]["role"] == BASE.role


def test_metrics_from_model_tar_reads_json_in_a_folder(sweep):
    data = tar_bytes(
        {"weights/best.pt": b"x", "out/metrics.json": json.dumps({"samples_per_s": 12.5}).encode()}
    )
    assert sweep.metrics_from_model_tar(data) == {"samples_per_s": 12.5}


def test_metrics_from_model_tar_errors_name_the_source(sweep):
    with pytest.raises(DataError, match=r"job-1: no metrics.json inside \(files: a.txt\)"):
        sweep.metrics_from_model_tar(tar_bytes({"a.txt": b"1"}), source="job-1")
    with pytest.raises(DataError, match="not a readable tar"):
        sweep.metrics_from_model_tar(b"not a tar", source="job-1")
    with pytest.raises(DataError, match="not valid JSON"):
        sweep.metrics_from_model_tar(tar_bytes({"metrics.json": b"{"}), source="job-1")


def test_throughput_dotted_key(sweep):
    metrics = {"throughput": {"samples_per_s": 640.0}, "mAP50": 0.5}
    assert sweep.throughput(metrics, "throughput.samples_per_s") == 640.0
    with pytest.raises(DataError, match="present: mAP50, throughput"):
        sweep.throughput(metrics, "samples_per_s", source="job-2")
    with pytest.raises(DataError, match="positive number"):
        sweep.throughput({"samples_per_s": 0}, "samples_per_s")


def test_scaling_efficiency_exact(sweep):
    p = sweep.SweepPoint
    results = [
        (p(nodes=2, workers=8, batch_per_gpu=32), "j2", 1900.0),
        (p(nodes=1, workers=8, batch_per_gpu=32), "j1", 1000.0),
        (p(nodes=8, workers=8, batch_per_gpu=32), "j8", 7200.0),
        (p(nodes=2, workers=8, batch_per_gpu=48), "k2", 2000.0),  # no 1-node job in its group
    ]
    rows = sweep.scaling_efficiency(results)
    assert [r.job_name for r in rows] == ["j1", "j2", "k2", "j8"]  # sorted by (nodes, workers, batch)
    assert [r.efficiency for r in rows] == [1.0, 0.95, None, 0.9]
    assert [r.per_node_samples_per_s for r in rows] == [1000.0, 950.0, 1000.0, 900.0]
    table = sweep.format_rows(rows)
    assert "95.0%" in table and "90.0%" in table


def test_parse_hp(sweep):
    assert sweep.parse_hp(["cfg=yolov5x", "hyp-override=lr0=0.02"]) == {
        "cfg": "yolov5x",
        "hyp-override": "lr0=0.02",
    }
    with pytest.raises(ConfigError, match="key=value"):
        sweep.parse_hp(["epochs"])


def test_default_key_reads_the_trainers_metrics_json(sweep):
    # the shape reporting.write_final_outputs writes: throughput over all ranks under "throughput"
    metrics = {
        "final": None,
        "world_size": 16,
        "throughput": {"samples_per_sec": 3100.0, "samples_per_sec_per_gpu": 193.75},
    }
    data = tar_bytes({"metrics.json": json.dumps(metrics).encode(), "best.pt": b"weights"})
    assert sweep.throughput(sweep.metrics_from_model_tar(data)) == 3100.0
