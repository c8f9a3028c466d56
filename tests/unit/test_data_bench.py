"""The data benchmarks: the worker recommendation rule, and a tiny end-to-end `bench data` run."""

import argparse
import json

from yolov5_smddp.bench import data as bench_data
from yolov5_smddp.bench.workers import recommend


def test_recommend_smallest_within_five_percent():
    assert recommend({0: 50.0, 2: 96.0, 4: 100.0, 8: 99.0}) == 2
    assert recommend({0: 50.0, 2: 90.0, 4: 100.0}) == 4
    assert recommend({4: 10.0}) == 4


def test_bench_data_tiny_run(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    bench_data.add_arguments(parser)
    out = tmp_path / "r.json"
    args = parser.parse_args(
        [
            "--imgsz",
            "128",
            "--iters",
            "6",
            "--workers",
            "0",
            "--batch-size",
            "2",
            "--scan-images",
            "12",
            "--coco-images",
            "50",
            "--coco-boxes",
            "300",
            "--json",
            str(out),
        ]
    )
    assert bench_data.run(args) == 0
    results = json.loads(out.read_text())
    assert results["pairs"] == 12
    for key in (
        "label_scan_pairs_per_s",
        "cache_load_pairs_per_s",
        "mosaic_samples_per_s_1proc_recent",
        "mosaic_samples_per_s_1proc_random",
        "mosaic_samples_per_s_0workers",
    ):
        assert results[key] > 0
    assert (results["coco_images"], results["coco_boxes"]) == (50, 300)
    assert results["coco_4ranks_parses"] == 1  # one host's ranks: one parses, the others load
    for key in ("coco_index_build_s", "coco_index_warm_peak_rss_mb", "coco_index_cache_load_s"):
        assert results[key] > 0
    assert "label_scan_pairs_per_s" in capsys.readouterr().out
