"""The COCO-sized index measurement of `bench data`: a generated instances JSON of train2017's size
(118,287 images, 860,001 boxes, each with a 16-point polygon so the file is JSON-heavy like the real
one), then in fresh processes (so peak memory is the job's alone): a cold build (hash + parse + the
cached arrays written) and a warm load (hash + the arrays read), each with its wall time and peak RSS,
and `ranks` processes starting together on an empty cache as one host's ranks do (one parses).
No image files are written: the index's JSON side is what is measured (image checks are per file,
as in the label scan)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from yolov5_smddp.data.coco import load_coco, split_annotations

TRAIN2017_IMAGES = 118_287
TRAIN2017_BOXES = 860_001
_CATEGORY_IDS = [i for i in range(1, 91) if i not in (12, 26, 29, 30, 45, 66, 68, 69, 71, 83)]  # COCO's 80


def write_coco_json(path: Path, n_images: int, n_boxes: int, seed: int = 0) -> Path:
    """A syntactically complete instances JSON of that size (boxes inside their images)."""
    rng = np.random.default_rng(seed)
    widths = rng.integers(320, 641, n_images)
    heights = rng.integers(240, 481, n_images)
    owner = np.sort(rng.integers(0, n_images, n_boxes))
    bw = rng.uniform(0.02, 0.9, n_boxes) * widths[owner]
    bh = rng.uniform(0.02, 0.9, n_boxes) * heights[owner]
    x = rng.uniform(0, 1, n_boxes) * (widths[owner] - bw)
    y = rng.uniform(0, 1, n_boxes) * (heights[owner] - bh)
    cats = rng.choice(_CATEGORY_IDS, n_boxes)
    crowd = rng.random(n_boxes) < 0.01
    images = [
        {"license": 1, "file_name": f"{i:012d}.jpg", "height": int(h), "width": int(w), "id": i + 1}
        for i, (w, h) in enumerate(zip(widths.tolist(), heights.tolist()))
    ]
    t = np.linspace(0, 2 * np.pi, 16, endpoint=False)
    anns = []
    for k, (o, xx, yy, ww, hh, c, cr) in enumerate(
        zip(owner.tolist(), x.tolist(), y.tolist(), bw.tolist(), bh.tolist(), cats.tolist(), crowd.tolist())
    ):
        cx, cy = xx + ww / 2, yy + hh / 2
        poly = np.round(np.stack([cx + ww / 2 * np.cos(t), cy + hh / 2 * np.sin(t)], 1).reshape(-1), 2)
        anns.append(
            {
                "segmentation": [poly.tolist()],
                "area": round(ww * hh * 0.7, 2),
                "iscrowd": int(cr),
                "image_id": o + 1,
                "bbox": [round(xx, 2), round(yy, 2), round(ww, 2), round(hh, 2)],
                "category_id": int(c),
                "id": k + 1,
            }
        )
    categories = [{"supercategory": "thing", "id": c, "name": f"class{c}"} for c in _CATEGORY_IDS]
    with open(path, "w", encoding="utf-8") as f:
        json.dump(
            {"info": {}, "licenses": [], "images": images, "annotations": anns, "categories": categories}, f
        )
    return path


def _peak_rss_mb() -> float:
    """This process's peak resident memory (VmHWM: reset by exec, unlike ru_maxrss, which a child
    started from a large parent inherits)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _child(json_path: str, cache_dir: str) -> None:
    """One measurement in this (fresh) process; prints a JSON line. The baseline includes numpy and the
    COCO reader (imported with this module), as in a job."""
    base = _peak_rss_mb()
    start = time.perf_counter()
    table, state = load_coco(Path(json_path), Path(cache_dir))
    seconds = time.perf_counter() - start
    start = time.perf_counter()  # the per-job conversion into per-image label arrays (image checks aside)
    usable = np.ones(len(table.image_ids), dtype=bool)
    split = split_annotations(table, usable, table.widths, table.heights)
    split_seconds = time.perf_counter() - start
    print(
        json.dumps(
            {
                "state": state,
                "seconds": seconds,
                "split_seconds": split_seconds,
                "training_boxes": sum(len(lab) for lab in split.labels),
                "peak_rss_mb": _peak_rss_mb(),
                "baseline_rss_mb": base,
                "images": len(table.image_ids),
                "boxes": len(table.boxes),
                "crowd": int(table.crowd.sum()),
            }
        )
    )


def _measure(json_path: Path, cache_dir: Path) -> dict:
    code = (
        "import sys; from yolov5_smddp.benchmarks.coco_index import _child; _child(sys.argv[1], sys.argv[2])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(json_path), str(cache_dir)],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ},
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure_ranks(json_path: Path, cache_dir: Path, ranks: int) -> list[dict]:
    """`ranks` fresh processes loading the same JSON at once into an empty `cache_dir`, as the ranks of
    one host do: each one's state ('built' = it parsed), seconds and peak RSS."""
    code = (
        "import sys; from yolov5_smddp.benchmarks.coco_index import _child; _child(sys.argv[1], sys.argv[2])"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(json_path), str(cache_dir)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(ranks)
    ]
    return [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]


def measure_coco_index(
    workdir: Path, n_images: int = TRAIN2017_IMAGES, n_boxes: int = TRAIN2017_BOXES, ranks: int = 4
) -> dict:
    """Generate, then cold build and warm load in fresh processes; the `bench data` rows."""
    json_path = workdir / "instances_bench.json"
    cache_dir = workdir / "coco-cache"
    start = time.perf_counter()
    write_coco_json(json_path, n_images, n_boxes)
    generate_s = time.perf_counter() - start
    cold = _measure(json_path, cache_dir)
    warm = _measure(json_path, cache_dir)
    (npz,) = cache_dir.glob("*.cocoindex.npz")
    together = measure_ranks(json_path, workdir / "coco-cache-ranks", ranks) if ranks > 1 else []
    return {
        "coco_images": cold["images"],
        "coco_boxes": cold["boxes"],
        "coco_json_mb": json_path.stat().st_size / 2**20,
        "coco_json_generation_s": generate_s,
        "coco_index_build_s": cold["seconds"],
        "coco_index_build_peak_rss_mb": cold["peak_rss_mb"],
        "coco_index_cache_mb": npz.stat().st_size / 2**20,
        "coco_index_cache_load_s": warm["seconds"],
        "coco_index_warm_peak_rss_mb": warm["peak_rss_mb"],  # load + per-image arrays
        "coco_index_to_label_arrays_s": warm["split_seconds"],
        "coco_process_baseline_rss_mb": cold["baseline_rss_mb"],
        **(
            {
                f"coco_{ranks}ranks_parses": sum(r["state"] == "built" for r in together),
                f"coco_{ranks}ranks_peak_rss_mb_sum": sum(r["peak_rss_mb"] for r in together),
                f"coco_{ranks}ranks_wall_s_max": max(r["seconds"] for r in together),
            }
            if together
            else {}
        ),
    }
