"""--batch-size -1 (AutoBatch): the line fit that sizes the batch, the probes up to the first out of memory,
and the one-line refusal on a CPU. All ranks taking the smallest: tests/unit/test_collectives.py (two real
ranks under the strict SMDDP stand-in, whose all_reduce has no MIN)."""

from __future__ import annotations

import pytest
import torch

from yolov5_smddp.config.train_config import parse_train_args
from yolov5_smddp.distributed.process_group import DistInfo
from yolov5_smddp.errors import ConfigError
from yolov5_smddp.train import autobatch
from yolov5_smddp.train.decisions import decide

ONE_RANK = DistInfo(0, 0, 1, 1, 0, "127.0.0.1", 29500, "none")
GIB = 1024**3


def test_the_batch_is_where_the_fitted_line_meets_the_budget():
    # 1 GiB fixed + 0.5 GiB per image: a 10 GiB budget holds 18 images
    sizes = [1, 2, 4, 8]
    peaks = [GIB + 0.5 * GIB * b for b in sizes]
    assert autobatch.fit_batch(sizes, peaks, 10.1 * GIB) == 18
    assert autobatch.fit_batch(sizes, peaks, 1.2 * GIB) == 0  # not even one image fits
    assert autobatch.fit_batch(sizes, peaks, 10_000 * GIB) == autobatch.MAX_BATCH
    assert autobatch.fit_batch([1, 2], [GIB, GIB], 10 * GIB) == 2  # flat: the largest probed


def test_on_a_cpu_it_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError) as refused:
        decide(parse_train_args(["--batch-size", "-1", "--cfg", "yolov5n"]), ONE_RANK)
    assert str(refused.value) == autobatch.CPU_REFUSAL
    with pytest.raises(ConfigError, match="leave --batch-per-gpu out"):
        decide(parse_train_args(["--batch-size", "-1", "--batch-per-gpu", "4"]), ONE_RANK)
    with pytest.raises(ConfigError, match="--batch-size"):
        parse_train_args(["--batch-size", "-2"])


def test_probing_stops_at_the_first_size_that_runs_out_of_memory(monkeypatch):
    peak = {"bytes": 0.0}

    def step(batch: int) -> None:  # 1 GiB fixed + 1 GiB per image; batch 8 runs out of memory
        if batch >= 8:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        peak["bytes"] = GIB + GIB * batch

    for name in ("empty_cache", "synchronize"):
        monkeypatch.setattr(torch.cuda, name, lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a, **k: peak.update(bytes=0.0))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a, **k: peak["bytes"])
    sizes, peaks = autobatch.probe_peaks(step, "cuda:0")
    assert sizes == [1, 2, 4] and peaks == [2 * GIB, 3 * GIB, 5 * GIB]
    assert autobatch.fit_batch(sizes, peaks, 6.5 * GIB) == 5
    with pytest.raises(ValueError, match="not memory"):  # anything else is not a probe's end
        autobatch.probe_peaks(lambda b: (_ for _ in ()).throw(ValueError("not memory")), "cuda:0")
