"""The scaling model against real PyTorch DDP on this machine (Gloo, CPU)."""

import os
import socket

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel

from bench.overlap import measure_overlap
from bench.scaling import ddp_buckets, gradient_profile
from yolov5_smddp.distributed import process_group
from yolov5_smddp.models.yolo import build_model


@pytest.fixture
def one_process_group():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    use_libuv = os.environ.get("USE_LIBUV", "0") != "0"
    info = process_group.DistInfo(0, 0, 1, 1, 0, "127.0.0.1", port, "torchrun", use_libuv=use_libuv)
    process_group.init(info, "gloo", "cpu", 60.0)  # the trainer's setup, and its leaving below
    yield
    process_group.destroy()


@pytest.mark.parametrize("cfg", ["yolov5n", pytest.param("yolov5s", marks=pytest.mark.slow)])
def test_model_buckets_equal_the_ones_ddp_rebuilds(one_process_group, cfg):
    profile = gradient_profile(build_model(cfg).train().to("meta"))
    tensor_bytes = profile.tensor_bytes(4)
    predicted = [
        sum(tensor_bytes[i] for i in b) for b in ddp_buckets(tensor_bytes, ready_order=profile.ready_order)
    ]

    ddp = DistributedDataParallel(build_model(cfg).train())
    images = torch.rand(1, 3, 64, 64)
    for _ in range(3):  # DDP rebuilds its buckets in gradient-ready order after the first iteration
        sum(o.mean() for o in ddp(images)).backward()
    rebuilt = [int(v) for v in ddp._get_ddp_logging_data()["rebuilt_bucket_sizes"].split(",")]
    assert predicted == rebuilt
    assert sum(predicted) == sum(p.numel() * 4 for p in ddp.module.parameters())


@pytest.mark.slow
def test_two_gloo_processes_measure_overlap():
    result = measure_overlap(cfg="yolov5n", imgsz=64, batch=1, iters=3)
    assert result.model_bucket_bytes == result.ddp_bucket_bytes
    assert result.buckets == len(result.ddp_bucket_bytes) >= 2
    assert result.forward_ms > 0 and result.backward_ms > 0 and result.bucket_allreduce_ms > 0
    assert result.step_no_sync_ms > 0 and result.step_sync_local_ms > 0 and result.step_sync_ms > 0
    assert result.noise_ms >= 0
    assert 0 <= result.predicted_exposed_ms <= result.predicted_if_no_overlap_ms
    assert "exposed communication: measured" in result.summary()
