"""`yolov5-smddp val --weights W --data D [--save-json]`: validate weights on a dataset's val split.

Prints one metric line (precision, recall, mAP50, mAP50-95) and the results table: the row "all" and, with
--verbose or fewer than 50 classes (the release's rule), a row per class (images holding the class, its
instances, P, R, mAP50, mAP50-95); --metrics-json holds the per-class values too ("per_class"). With --save-json it also writes the
detections (`predictions.json`) and the ground truth (`ground_truth.json`) in COCO format, in original
image pixels, and scores them with pycocotools when it is installed (maxDets 300 to match our max_det).
On a COCO JSON split (`--data` a data.yaml pointing at one, or the JSON itself) the detections carry the
JSON's own `image_id`s and `category_id`s, so `COCOeval` runs on `predictions.json` against that JSON
unchanged; `ground_truth.json` is then the JSON's scored images and boxes (crowd regions included).

Images the label scan rejects (bad image or label files, over --max-image-pixels) and images that fail
to decode during validation are left out and named ("skipped: <path>: <why>"); the metric line says how
many (`skipped=`), so the number of scored images is never changed silently.

Under torchrun or mpirun every rank validates its own contiguous block of whole rectangular batches
(see `valshard`); the match results are gathered to rank 0, whose metrics equal one process's exactly.
The log says how the images were split ("val: 15 of 30 images on each of 2 ranks"); only rank 0 prints
and writes the JSON files (the detections are gathered to it).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path

from yolov5_smddp.commands.options import (
    add_cache_dir_option,
    add_model_input_options,
    add_threshold_options,
    add_weights_option,
    make_folder,
)
from yolov5_smddp.files.atomic import atomic_write

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_weights_option(parser, help="weights file (ours or the release's .pt)")
    parser.add_argument("--data", required=True, help="data.yaml, or a COCO instances JSON")
    parser.add_argument(
        "--split",
        "--task",
        dest="split",
        default="val",
        choices=("val", "test", "train"),
        help="which split to score (--task: the release's name for it)",
    )
    add_model_input_options(parser, device_default=None, height_width=False, images=True)
    parser.add_argument("--batch-size", "--batch_size", dest="batch_size", type=int, default=32)
    add_threshold_options(parser, conf=0.001, iou=0.6, max_det=300)
    parser.add_argument(
        "--single-cls",
        "--single_cls",
        dest="single_cls",
        action="store_true",
        help="score every class as one (for a model trained with train --single-cls)",
    )
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--amp", default="off", choices=("off", "fp16", "bf16", "auto"))
    parser.add_argument(
        "--backend",
        default="auto",
        choices=("auto", "smddp", "nccl", "gloo"),
        help="process-group backend under torchrun/mpirun (auto: smddp, else nccl on GPUs, else gloo)",
    )
    parser.add_argument(
        "--dist-timeout",
        "--dist_timeout",
        dest="dist_timeout",
        type=float,
        default=1800.0,
        help="seconds a collective may wait under torchrun/mpirun",
    )
    parser.add_argument(
        "--save-json",
        "--save_json",
        dest="save_json",
        action="store_true",
        help="write COCO-format JSON and score it with pycocotools",
    )
    parser.add_argument("--output-dir", "--output_dir", dest="output_dir", default="runs/val")
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="a row per class in the results table (without it: only with fewer than 50 classes)",
    )
    parser.add_argument(
        "--metrics-json",
        "--metrics_json",
        dest="metrics_json",
        default=None,
        help="also write the metrics at full precision to this JSON file (rank 0)",
    )
    add_cache_dir_option(parser)


def detection_json(row: Sequence[float], image_ids: Sequence[int], category_ids: Sequence[int]) -> dict:
    """One COCO result from a gathered detection row (position in the index, x1, y1, x2, y2, score,
    class), with the result ids of that position and class."""
    position, x1, y1, x2, y2, score, cls = row
    return {
        "image_id": image_ids[int(position)],
        "category_id": category_ids[int(cls)],
        "bbox": [x1, y1, x2 - x1, y2 - y1],
        "score": score,
    }


def _coco_ground_truth(index, scored: set[str]) -> dict:
    """COCO ground truth of the `scored` images of `index` (ids = positions in the index)."""
    images, annotations = [], []
    for image_id, (path, (h, w), labels) in enumerate(zip(index.images, index.shapes, index.labels)):
        if str(path) not in scored:
            continue
        images.append({"id": image_id, "file_name": str(path), "height": int(h), "width": int(w)})
        for cls, xc, yc, bw, bh in labels.tolist():
            box = [(xc - bw / 2) * w, (yc - bh / 2) * h, bw * w, bh * h]
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image_id,
                    "category_id": int(cls),
                    "bbox": box,
                    "area": box[2] * box[3],
                    "iscrowd": 0,
                }
            )
    return {"images": images, "annotations": annotations}


def _coco_json_ground_truth(index, scored: set[str], names: list[str]) -> dict:
    """COCO ground truth of the `scored` images of an index read from a COCO JSON, in the JSON's own
    image and category ids; crowd regions are written with `iscrowd: 1`."""
    meta = index.coco
    images, annotations = [], []
    crowds = index.crowd or [None] * len(index.images)
    for path, (h, w), labels, crowd, image_id in zip(
        index.images, index.shapes, index.labels, crowds, meta.image_ids.tolist()
    ):
        if str(path) not in scored:
            continue
        images.append({"id": image_id, "file_name": str(path), "height": int(h), "width": int(w)})
        rows = [(row, 0) for row in labels.tolist()] + [
            (row, 1) for row in (crowd if crowd is not None else [])
        ]
        for (cls, xc, yc, bw, bh), iscrowd in rows:
            box = [(xc - bw / 2) * w, (yc - bh / 2) * h, bw * w, bh * h]
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image_id,
                    "category_id": meta.category_ids[int(cls)],
                    "bbox": box,
                    "area": box[2] * box[3],
                    "iscrowd": iscrowd,
                }
            )
    categories = [{"id": cid, "name": name} for cid, name in zip(meta.category_ids, names)]
    return {"images": images, "annotations": annotations, "categories": categories}


def _pycocotools_scores(gt_path: Path, dt: list[dict]) -> dict[str, float] | None:
    try:
        from pycocotools.coco import COCO
        from pycocotools.cocoeval import COCOeval
    except ImportError:
        return None
    gt = COCO(str(gt_path))
    if not dt:
        return {"mAP50": 0.0, "mAP50-95": 0.0}
    evaluator = COCOeval(gt, gt.loadRes(dt), "bbox")
    evaluator.params.maxDets = [1, 10, 300]
    evaluator.evaluate()
    evaluator.accumulate()
    # precision [T, R, K, A, M] at area "all" and maxDets 300; -1 marks classes without ground truth
    # (summarize() would read maxDets 100 for its first number)
    import numpy as np

    precision = evaluator.eval["precision"][:, :, :, 0, -1]
    per_class = np.where(precision > -1, precision, np.nan).mean(1)  # [T, K]
    valid = ~np.isnan(per_class[0])
    if not valid.any():
        return {"mAP50": 0.0, "mAP50-95": 0.0}
    return {"mAP50-95": float(per_class[:, valid].mean()), "mAP50": float(per_class[0, valid].mean())}


def run(args: argparse.Namespace) -> int:
    from yolov5_smddp.distributed import process_group
    from yolov5_smddp.errors import ConfigError

    if args.imgsz < 32 or args.imgsz % 32:
        raise ConfigError(f"--imgsz={args.imgsz} must be a multiple of 32")
    info = process_group.detect_dist_info(os.environ)
    if info.rank == 0:  # before the scan and the scoring: a folder that cannot be made fails at once
        make_output_folders(args)
    try:
        code = _validate(args, info)
    except BaseException:
        process_group.teardown(None)  # bounded; the failure goes on to be reported
        raise
    process_group.teardown(code)  # the final barrier, the store's host last, as after training
    return code


def make_output_folders(args: argparse.Namespace) -> None:
    """Makes --metrics-json's folder and, with --save-json, --output-dir; ConfigError naming the one
    that cannot be made."""
    if args.metrics_json:
        make_folder(Path(args.metrics_json).parent, "--metrics-json")
    if args.save_json:
        make_folder(Path(args.output_dir), "--output-dir")


def _validate(args: argparse.Namespace, info) -> int:
    import torch

    from yolov5_smddp.data.cache import choose_cache_dir
    from yolov5_smddp.data.config import load_data_config
    from yolov5_smddp.data.loader import build_val_loader
    from yolov5_smddp.detection.metrics import results_table
    from yolov5_smddp.distributed import collectives, process_group
    from yolov5_smddp.distributed.valshard import split_summary
    from yolov5_smddp.errors import ConfigError
    from yolov5_smddp.models.weights import load_model
    from yolov5_smddp.telemetry import emit, metric_line
    from yolov5_smddp.train.data_wiring import scan_split, single_class
    from yolov5_smddp.train.decisions import decide_device
    from yolov5_smddp.train.engine import evaluate

    main = info.rank == 0
    choice = decide_device(args.backend, args.amp, info, device=args.device or "")  # as train decides
    cache_dir = choose_cache_dir(args.cache_dir)
    data = load_data_config(args.data, cache_dir=cache_dir)
    if not getattr(data, args.split):
        raise ConfigError(f"--split {args.split}: {args.data} has no '{args.split}' entry")
    index = scan_split(
        data, args.split, cache_dir=cache_dir, workers=args.workers or 1, max_pixels=args.max_image_pixels
    )
    names, nc = single_class(data, index) if args.single_cls else (list(data.names), data.nc)
    if info.distributed:  # after the scan: a long scan never runs inside the store's timeout
        device = process_group.init(info, choice.backend, choice.device_type, args.dist_timeout)
    else:
        device = torch.device(args.device or choice.device_type)
    model = load_model(args.weights, device=device).eval()
    if model.nc != nc:
        hint = " (a --single-cls model: add --single-cls)" if model.nc == 1 and not args.single_cls else ""
        raise ConfigError(f"--weights {args.weights} has {model.nc} classes but {args.data} has {nc}{hint}")
    loader = build_val_loader(
        index,
        args.imgsz,
        batch_size=args.batch_size,
        stride=int(model.stride.max()),
        workers=args.workers,
        rank=info.rank,
        world_size=info.world_size,
    )
    dataset = loader.dataset
    if main:
        log.info("val: %s", split_summary(len(dataset), args.batch_size, info.world_size))
    # result ids: positions in the index, or the COCO JSON's own image and category ids
    json_ids = index.coco.image_ids.tolist() if index.coco is not None else list(range(len(index.images)))
    positions = {str(p): i for i, p in enumerate(index.images)}
    category_ids = index.coco.category_ids if index.coco is not None else range(nc)
    detection_rows: list[torch.Tensor] = []  # float64 [k, 7] per image: position, x1, y1, x2, y2, score, cls
    scored: list[int] = []  # index positions of the images this rank scored

    def collect(path: str, dets) -> None:
        scored.append(positions[path])
        position = torch.full((dets.shape[0], 1), float(positions[path]), dtype=torch.float64)
        detection_rows.append(torch.cat([position, dets[:, :6].detach().cpu().double()], 1))

    started = time.perf_counter()
    metrics = evaluate(
        model,
        loader,
        device=device,
        amp=choice.amp,
        conf_thres=args.conf,
        iou_thres=args.iou,
        max_det=args.max_det,
        on_image=collect if args.save_json else None,
        gather=True,
    )
    seconds = time.perf_counter() - started  # rank 0: its shard, then the gather
    detections_json: list[dict] = []
    scored_paths: set[str] = set()
    if args.save_json:
        # every rank's detection rows and scored positions, in rank order (positions in the shared index),
        # as plain float64 tensors (all_gather_rows ships them exactly as float32: nothing else on the wire)
        own = torch.cat(detection_rows) if detection_rows else torch.zeros((0, 7), dtype=torch.float64)
        all_rows = torch.cat(collectives.all_gather_rows(own)).tolist()
        own_scored = torch.tensor(scored, dtype=torch.float64).view(-1, 1)
        gathered = torch.cat(collectives.all_gather_rows(own_scored)).view(-1).tolist()
        scored_paths = {str(index.images[int(i)]) for i in gathered}
        detections_json = [detection_json(row, json_ids, category_ids) for row in all_rows]
    undecodable = torch.tensor([float(dataset.undecodable_samples.value)], device=device)
    undecodable = int(process_group.all_reduce_sum(undecodable).item())  # every rank's share
    if not main:
        return 0
    skipped = index.report.bad + undecodable
    if skipped:
        log.warning(
            "val: %d of %d images skipped (named in the 'skipped:' lines above); the metrics cover %d",
            skipped,
            index.report.found,
            metrics.num_images,
        )
    emit(
        metric_line(
            images=metrics.num_images,
            skipped=skipped,
            targets=metrics.num_targets,
            **metrics.to_dict(),
            val_seconds=seconds,
        ),
        main=True,
    )
    log.info("\n%s", results_table(metrics, names, per_class=args.verbose or len(names) < 50))
    if args.metrics_json:
        summary = {**metrics.to_dict(), "images": metrics.num_images, "targets": metrics.num_targets}
        summary["per_class"] = metrics.per_class(names)
        summary["val_seconds"] = seconds
        with atomic_write(args.metrics_json, "w", encoding="utf-8") as handle:
            handle.write(json.dumps({**summary, "skipped": skipped}))
    if args.save_json:
        out = Path(args.output_dir)
        gt_path = out / "ground_truth.json"
        if index.coco is not None:
            gt = _coco_json_ground_truth(index, scored_paths, names)
        else:
            gt = _coco_ground_truth(index, scored_paths)
            gt["categories"] = [{"id": i, "name": name} for i, name in enumerate(names)]
        for path, content in ((gt_path, gt), (out / "predictions.json", detections_json)):
            with atomic_write(path, "w", encoding="utf-8") as handle:
                handle.write(json.dumps(content))
        scores = _pycocotools_scores(gt_path, detections_json)
        if scores is not None:
            emit(metric_line(pycocotools=1, **scores), main=True)
    return 0
