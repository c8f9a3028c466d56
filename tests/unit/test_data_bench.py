"""The data benchmarks: the worker recommendation rule, and a tiny end-to-end `bench data` run."""

import argparse
import json

import cv2
import numpy as np

from yolov5_smddp.benchmarks import data as bench_data
from yolov5_smddp.benchmarks.workers import recommend
from yolov5_smddp.data.augment import AugmentParams


def test_recommend_smallest_within_five_percent():
    assert recommend({0: 50.0, 2: 96.0, 4: 100.0, 8: 99.0}) == 2
    assert recommend({0: 50.0, 2: 90.0, 4: 100.0}) == 4
    assert recommend({4: 10.0}) == 4


def test_bench_data_tiny_run(tmp_path, capsys, monkeypatch):
    built = []

    def stand_in_release(images_dir, imgsz):  # the release's package is not in the test image: our
        # dataset stands in for its row (the same folder, as the release gets it)
        from yolov5_smddp.data.dataset import YoloDataset
        from yolov5_smddp.data.labels import build_label_index

        built.append((len(list(images_dir.glob("*.jpg"))), imgsz))
        index = build_label_index([images_dir], nc=3, root=images_dir.parents[1], cache_dir=tmp_path / "r")
        return YoloDataset(index, imgsz, augment=True, hyp=None)

    monkeypatch.setattr(bench_data, "release_dataset", stand_in_release)
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
        "mosaic_samples_per_s_1proc_random_no_restart",
        "mosaic_samples_1proc_random_cpu_ms",
        "mosaic_samples_1proc_random_no_restart_cpu_ms",
        "release_mosaic_samples_1proc_cpu_ms",
        "mosaic_samples_per_s_0workers",
    ):
        assert results[key] > 0
    # the decode-only ceiling (the default's four decodes per sample, nothing else) and each pipeline's
    # fraction of it, the release's row included
    assert built == [(12, 128)]
    ceiling = results["decode_ceiling_samples_per_s_1proc"]
    assert ceiling > 0 and results["release_mosaic_samples_per_s_1proc"] > 0
    for fraction, rate in (
        ("mosaic_1proc_random_of_ceiling", "mosaic_samples_per_s_1proc_random"),
        ("mosaic_1proc_random_whole_of_ceiling", "mosaic_samples_per_s_1proc_random_whole"),
        ("mosaic_1proc_recent_of_ceiling", "mosaic_samples_per_s_1proc_recent"),
        ("release_mosaic_1proc_of_ceiling", "release_mosaic_samples_per_s_1proc"),
    ):
        assert results[fraction] == results[rate] / ceiling
    region_ceiling = results["region_decode_ceiling_samples_per_s_1proc"]
    assert region_ceiling > 0
    assert results["mosaic_1proc_random_of_region_ceiling"] == (
        results["mosaic_samples_per_s_1proc_random"] / region_ceiling
    )
    assert results["ours_random_whole_vs_release"] == (
        results["mosaic_samples_per_s_1proc_random_whole"] / results["release_mosaic_samples_per_s_1proc"]
    )
    assert results["ours_random_vs_release"] == (
        results["mosaic_samples_per_s_1proc_random"] / results["release_mosaic_samples_per_s_1proc"]
    )
    assert (results["coco_images"], results["coco_boxes"]) == (50, 300)
    assert results["coco_4ranks_parses"] == 1  # one host's ranks: one parses, the others load
    for key in ("coco_index_build_s", "coco_index_warm_peak_rss_mb", "coco_index_cache_load_s"):
        assert results[key] > 0
    printed = capsys.readouterr().out
    assert "label_scan_pairs_per_s" in printed
    assert (
        f"{'mosaic_1proc_random_of_ceiling':<50}{results['mosaic_1proc_random_of_ceiling']:>12.2f}" in printed
    )


def test_decode_ceiling_decodes_the_four_images_of_each_plan(tmp_path, monkeypatch):
    """The ceiling's step decodes exactly the default pipeline's mosaic plan, with its decode flags."""
    from yolov5_smddp.data import decode
    from yolov5_smddp.data.dataset import YoloDataset
    from yolov5_smddp.data.labels import build_label_index
    from yolov5_smddp.data.synthetic import make_default_dataset

    root = tmp_path / "d"
    make_default_dataset(root, n_train=6, n_val=0, imgsz=64, seed=0)
    index = build_label_index([root / "images" / "train"], nc=3, root=root, cache_dir=tmp_path / "c")
    decoded = []
    monkeypatch.setattr(decode, "decode_image", lambda path, flag=None: decoded.append((path, flag)))
    step = bench_data._ceiling_stream(YoloDataset(index, 32, augment=True, hyp=None, seed=3))
    step(0)
    step(1)
    twin = YoloDataset(index, 32, augment=True, hyp=None, seed=3)  # the same draws
    order = np.random.default_rng(0).permutation(6)
    plans = [twin.mosaic_plan(int(order[0])), twin.mosaic_plan(int(order[1]))]
    # 64 px images at 32: twice the size, so a 1/2-scale JPEG decode, as the training loader does
    assert decoded == [(index.images[j], twin.decode_flag(j)) for plan in plans for j in plan]
    assert twin.decode_flag(0) == cv2.IMREAD_REDUCED_COLOR_2


def test_region_ceiling_decodes_the_regions_the_default_pipeline_decodes(tmp_path, monkeypatch):
    """The region ceiling's step decodes exactly what the default pipeline decodes for the same draws:
    the same files, the same rectangles, nothing for a tile that does not show."""
    from yolov5_smddp.data import dataset as dataset_module
    from yolov5_smddp.data import jpeg_roi
    from yolov5_smddp.data.dataset import YoloDataset
    from yolov5_smddp.data.labels import build_label_index
    from yolov5_smddp.data.synthetic import make_default_dataset

    root = tmp_path / "d"
    make_default_dataset(root, n_train=8, n_val=0, imgsz=64, seed=0)
    index = build_label_index([root / "images" / "train"], nc=3, root=root, cache_dir=tmp_path / "c")
    seen = {"ceiling": [], "pipeline": []}

    def recorder(key):
        def fake(data, out, rect):
            seen[key].append((len(data), out.shape, rect))
            out[...] = 0
            return True

        return fake

    monkeypatch.setattr(jpeg_roi, "region_decoder", lambda: object())  # eligible without the library
    monkeypatch.setattr(jpeg_roi, "decode_region", recorder("ceiling"))
    monkeypatch.setattr(dataset_module, "decode_region", recorder("pipeline"))
    monkeypatch.setattr(dataset_module, "region_decoder", lambda: object())
    step = bench_data._region_ceiling_stream(
        YoloDataset(index, 64, augment=True, hyp=AugmentParams(mosaic=1.0), seed=3)
    )
    twin = YoloDataset(index, 64, augment=True, hyp=AugmentParams(mosaic=1.0), seed=3)
    order = np.random.default_rng(0).permutation(8)
    for k in range(6):
        step(k)
        twin._mosaic_sample(int(order[k]))  # the same draws: plan, then centre and affine
    assert seen["ceiling"] == seen["pipeline"] and len(seen["ceiling"]) > 12
