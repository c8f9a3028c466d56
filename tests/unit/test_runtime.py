"""runtime: the per-rank CPU thread cap and cuDNN's autotuner (pure decisions, then applied in torch),
and that a training run applies and logs them."""

import logging

import pytest
import torch
from tiny_training import tiny_training

from yolov5_smddp.train.runtime import (
    RuntimeSettings,
    apply_runtime,
    cpu_threads_per_rank,
    decide_runtime,
    threads_asked,
)


@pytest.mark.parametrize(
    "cpu_count, local_ranks, loader_workers, threads",
    [
        (96, 8, 8, 4),  # p4d: 12 cores a rank, 8 of them loading
        (96, 8, 0, 12),
        (192, 8, 8, 16),  # p5
        (8, 8, 1, 1),  # never below 1
        (8, 8, 8, 1),
        (4, 1, 2, 2),  # one rank on a small host
        (1, 1, 0, 1),
        (3, 2, 0, 1),  # 3 // 2 cores a rank
    ],
)
def test_cpu_threads_per_rank(cpu_count, local_ranks, loader_workers, threads):
    assert cpu_threads_per_rank(cpu_count, local_ranks, loader_workers) == threads


@pytest.mark.parametrize(
    "device_type, rect, multi_scale, benchmark, why",
    [
        ("cuda", False, False, True, "fixed training shapes"),
        ("cuda", True, False, False, "--rect"),
        ("cuda", False, True, False, "--multi-scale"),
        ("cuda", True, True, False, "--rect"),
        ("cpu", False, False, False, "no CUDA device"),
    ],
)
def test_cudnn_benchmark_only_for_fixed_shapes_on_cuda(device_type, rect, multi_scale, benchmark, why):
    settings = decide_runtime(
        cpu_count=96,
        local_ranks=8,
        loader_workers=8,
        device_type=device_type,
        rect=rect,
        multi_scale=multi_scale,
    )
    assert settings == RuntimeSettings(4, benchmark, why, "96 cores / 8 local ranks - 8 loader workers")


@pytest.mark.parametrize(
    "value, asked",
    [
        (None, None),
        ("", None),
        ("1", 1),
        ("12", 12),
        ("4,2", 4),
        (" 3 ", 3),
        ("0", None),
        ("-2", None),
        ("x", None),
    ],
)
def test_threads_asked_by_omp_num_threads(value, asked):
    assert threads_asked(value) == asked


def test_omp_num_threads_is_obeyed_over_the_cap():
    """A user (or torchrun) who asked for 1 thread gets 1, not the host's share: two such jobs on one
    2-core host each took 2 threads and ran tenfold slower (OpenMP threads spinning on a busy core)."""
    common = dict(
        cpu_count=2, local_ranks=1, loader_workers=0, device_type="cpu", rect=False, multi_scale=False
    )
    assert decide_runtime(**common) == RuntimeSettings(
        2, False, "no CUDA device", "2 cores / 1 local ranks - 0 loader workers"
    )
    obeyed = decide_runtime(**common, omp_num_threads="1")
    assert obeyed == RuntimeSettings(1, False, "no CUDA device", "OMP_NUM_THREADS=1")
    assert obeyed.log_line() == "cpu threads/rank 1 (OMP_NUM_THREADS=1); cudnn.benchmark off (no CUDA device)"
    assert decide_runtime(**common, omp_num_threads="16").threads == 16  # asked for: obeyed, as torch does
    ignored = decide_runtime(**common, omp_num_threads="many")
    assert ignored.threads == 2
    assert ignored.why_threads.endswith("OMP_NUM_THREADS='many' ignored: not a positive integer")


def test_apply_sets_torch(monkeypatch):
    threads, benchmark = torch.get_num_threads(), torch.backends.cudnn.benchmark
    try:
        apply_runtime(RuntimeSettings(1, True, "fixed training shapes", "OMP_NUM_THREADS=1"))
        assert (torch.get_num_threads(), torch.backends.cudnn.benchmark) == (1, True)
        apply_runtime(RuntimeSettings(2, False, "--rect", "2 cores / 1 local ranks - 0 loader workers"))
        assert (torch.get_num_threads(), torch.backends.cudnn.benchmark) == (2, False)
    finally:
        torch.set_num_threads(threads)
        torch.backends.cudnn.benchmark = benchmark


def test_a_training_run_applies_and_logs_them(tmp_path, monkeypatch, caplog):
    from yolov5_smddp.commands.train import main
    from yolov5_smddp.data.synthetic import make_default_dataset
    from yolov5_smddp.train import trainer

    data = make_default_dataset(tmp_path / "data", n_train=4, n_val=2, imgsz=64, seed=1)
    applied = []
    monkeypatch.setattr(trainer, "apply_runtime", applied.append)
    monkeypatch.setattr(trainer.os, "cpu_count", lambda: 6)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    out = tmp_path / "run"
    argv = tiny_training(out, data, "--epochs", "1", "--noplots", batch_size=2, workers=2)
    with caplog.at_level(logging.INFO):
        assert main(argv) == 0
    why = "6 cores / 1 local ranks - 2 loader workers"
    assert applied == [RuntimeSettings(4, False, "no CUDA device", why)]
    assert f"cpu threads/rank 4 ({why}); cudnn.benchmark off (no CUDA device)" in caplog.text
