import re

from yolov5_smddp import telemetry
from yolov5_smddp.telemetry import METRIC_DEFINITIONS, Throughput, metric_line


def _metric(name: str) -> str:
    return next(d["Regex"] for d in METRIC_DEFINITIONS if d["Name"] == name)


def test_line_format_and_regexes_read_it_behind_an_mpirun_prefix():
    line = "[1,0]<stdout>: " + metric_line(
        epoch=3,
        step=120,
        loss=4.25,
        box_loss=0.081,
        samples_per_sec=312.5,
        data_wait=0.12,
        **{"mAP50": 0.5, "mAP50-95": 0.3},
    )
    assert "epoch=3 step=120 loss=4.25 box_loss=0.081" in line
    values = {d["Name"]: re.search(d["Regex"], line) for d in METRIC_DEFINITIONS}
    assert float(values["train:loss"].group(1)) == 4.25  # not box_loss's value
    assert float(values["train:box_loss"].group(1)) == 0.081
    assert float(values["val:mAP50"].group(1)) == 0.5
    assert float(values["val:mAP50-95"].group(1)) == 0.3
    assert float(values["epoch"].group(1)) == 3
    assert all(not d["Regex"].startswith("^") for d in METRIC_DEFINITIONS)
    assert re.search(_metric("train:loss"), "loss=1.5e-03").group(1) == "1.5e-03"


def test_non_finite_values_are_printed_but_not_numbers():
    line = metric_line(loss=float("nan"))
    assert line == "loss=nan" and re.search(_metric("train:loss"), line) is None


def test_throughput_accounting(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(telemetry.time, "perf_counter", lambda: now[0])
    t = Throughput(world_size=4)  # the window opens at 100 s
    t.add(16, 0.25)
    t.add(16, 0.25)
    now[0] = 102.0
    assert t.summary() == {
        "samples_per_sec": 64.0,  # 32 samples in 2 s on each of 4 ranks
        "samples_per_sec_per_gpu": 16.0,
        "data_wait": 0.25,  # 0.5 s of 2 s blocked on the loader
        "seconds": 2.0,
    }
    t.reset()  # a new window at 102 s
    t.add(8, 3.0)
    now[0] = 104.0
    assert t.summary() == {
        "samples_per_sec": 16.0,
        "samples_per_sec_per_gpu": 4.0,
        "data_wait": 1.0,
        "seconds": 2.0,
    }
