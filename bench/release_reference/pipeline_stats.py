"""What the model sees, side by side (issue 38): training samples of the release's `LoadImagesAndLabels`
and of our `YoloDataset` on the same generated data, and the two losses' target assignment on identical
batches.

  python bench/release_reference/pipeline_stats.py [--kind textured --samples 10000 --imgsz 256 --out T.md]

Needs the release (the PyPI package `yolov5` 7.0.14, in a throwaway environment: never part of our image
or repository) importable next to this checkout. Both datasets get the release's scratch-low
hyperparameters, mosaic on, one thread. Each pipeline draws `--samples` samples (epochs of a shuffled
order); per class it reports the final boxes (count per sample, width / height / area histograms at the
network input), and from the box filter (box_candidates) of every mosaic: boxes cut away by the mosaic
canvas (zero size before the affine), boxes clipped by the output border (less area after the affine
than before it, scaled), and boxes the filter drops. Both sides are observed by wrapping their box filter
call (ours: `augment._apply_box_transform`; the release: `random_perspective` and `box_candidates`);
nothing of the release is copied.

Loss: the targets of every batch of 16 of each pipeline go, with the SAME predictions (seeded normal
logits, sd `--pred-sd`, the shapes of a 3-level head at `--imgsz`), to the release's `ComputeLoss` (with
the release model's anchors) and to our `YoloLoss` (the same anchors, gains scaled as both trainers do):
positives per level and anchor (the release's `build_targets` against our candidates' mask), objectness
targets (the CIoU written into each assigned cell), and the three loss parts' largest difference.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

CLIP_TOL = 0.999  # area after / area before below this: clipped by the output border
WH_EDGES = (0, 8, 16, 32, 48, 64, 96, 128, 160, 192, 256.01)
AREA_EDGES = tuple(e * e for e in WH_EDGES)
OBJ_EDGES = (0, 0.2, 0.4, 0.6, 0.8, 1.0001)


class FilterLog:
    """Per box entering the box filter: class, (w, h) before (canvas, times the affine's scale), (w, h)
    after (transformed, clipped to the output), kept, and the affine's scale (NaN where not known)."""

    def __init__(self) -> None:
        self.rows: list[np.ndarray] = []

    def add(
        self, cls: np.ndarray, before: np.ndarray, after: np.ndarray, keep: np.ndarray, scale: float = np.nan
    ) -> None:
        w1, h1 = before[:, 2] - before[:, 0], before[:, 3] - before[:, 1]
        w2, h2 = after[:, 2] - after[:, 0], after[:, 3] - after[:, 1]
        s = np.full(len(cls), scale, np.float64)
        self.rows.append(np.stack([cls, w1, h1, w2, h2, keep.astype(np.float64), s], 1).astype(np.float64))

    def table(self) -> np.ndarray:
        return np.concatenate(self.rows) if self.rows else np.zeros((0, 7))


def instrument_ours(log: FilterLog) -> None:
    from yolov5_smddp.data import augment

    original = augment._apply_box_transform

    def wrapped(labels, m, s, out_wh):
        new = augment.transform_boxes(labels[:, 1:5], m, out_wh)
        keep = augment.box_candidates(labels[:, 1:5] * s, new)
        log.add(labels[:, 0], labels[:, 1:5] * s, new, keep, s)
        return original(labels, m, s, out_wh)

    augment._apply_box_transform = wrapped


def instrument_release(log: FilterLog) -> None:
    import yolov5.utils.augmentations as aug
    import yolov5.utils.dataloaders as dl

    pending: dict[str, np.ndarray] = {}
    perspective, candidates = dl.random_perspective, aug.box_candidates

    def wrapped_perspective(im, targets=(), *args, **kwargs):
        pending["targets"] = np.asarray(targets).copy() if len(targets) else np.zeros((0, 5))
        return perspective(im, targets, *args, **kwargs)

    def wrapped_candidates(box1, box2, *args, **kwargs):
        keep = candidates(box1, box2, *args, **kwargs)
        targets, before = pending.pop("targets"), np.asarray(box1).T
        widths = targets[:, 3] - targets[:, 1]  # box1 = targets * the affine's scale
        wide = widths > 1
        scale = float(np.median((before[wide, 2] - before[wide, 0]) / widths[wide])) if wide.any() else np.nan
        log.add(targets[:, 0], before, np.asarray(box2).T, np.asarray(keep), scale)
        return keep

    dl.random_perspective, aug.box_candidates = wrapped_perspective, wrapped_candidates


def pixel_stats(chw: np.ndarray) -> np.ndarray:
    """float64 [6] of one RGB uint8 [3, H, W] sample: the channel means, the std, the fraction of grey
    pixels (R = G = B: the mosaic's pad after the HSV jitter, rarely anything else here), the mean absolute
    difference between horizontal and vertical neighbours (how sharp the sample is)."""
    img = chw.astype(np.int16)
    grey = (img[0] == img[1]) & (img[1] == img[2])
    grad = (np.abs(np.diff(img, axis=2)).mean() + np.abs(np.diff(img, axis=1)).mean()) / 2
    return np.array([*img.reshape(3, -1).mean(1), img.std(), grey.mean(), grad])


def draw_samples(dataset, n: int, seed: int) -> tuple[list[np.ndarray], np.ndarray]:
    """Targets [k, 6] (0, cls, xc, yc, w, h normalised) of n samples, epochs of a shuffled order, and
    their `pixel_stats` [n, 6]."""
    rng = np.random.default_rng(seed)
    out: list[np.ndarray] = []
    pixels: list[np.ndarray] = []
    while len(out) < n:
        for i in rng.permutation(len(dataset))[: n - len(out)]:
            item = dataset[int(i)]
            img, labels = (np.asarray(v.numpy() if hasattr(v, "numpy") else v) for v in item[:2])
            out.append(labels.astype(np.float32))
            pixels.append(pixel_stats(img))
    return out, np.stack(pixels)


def _hist(values: np.ndarray, edges) -> list[float]:
    counts, _ = np.histogram(values, bins=np.asarray(edges))
    return (counts / max(len(values), 1)).tolist()


def sample_stats(samples: list[np.ndarray], log: np.ndarray, imgsz: int, nc: int) -> dict:
    """Per class (and 'all'): final boxes per sample, w/h/area histograms (px at imgsz), filter fractions."""
    labels = np.concatenate(samples) if samples else np.zeros((0, 6))
    stats: dict = {"samples": len(samples), "per_sample": np.mean([len(s) for s in samples])}
    for key in [*range(nc), "all"]:
        mine = labels if key == "all" else labels[labels[:, 1] == key]
        rows = log if key == "all" else log[log[:, 0] == key]
        w, h = mine[:, 4] * imgsz, mine[:, 5] * imgsz
        w1, h1, w2, h2, keep = rows[:, 1], rows[:, 2], rows[:, 3], rows[:, 4], rows[:, 5] > 0
        on_canvas = (w1 > 0) & (h1 > 0)
        in_output = on_canvas & (w2 > 0) & (h2 > 0)
        ratio = np.where(on_canvas, w2 * h2 / np.maximum(w1 * h1, 1e-16), 0)
        clipped = in_output & (ratio < CLIP_TOL)
        stats[key] = {
            "boxes_per_sample": len(mine) / max(len(samples), 1),
            "w_mean": float(w.mean()) if len(w) else float("nan"),
            "h_mean": float(h.mean()) if len(h) else float("nan"),
            "area_median": float(np.median(w * h)) if len(w) else float("nan"),
            "w_hist": _hist(w, WH_EDGES),
            "h_hist": _hist(h, WH_EDGES),
            "area_hist": _hist(w * h, AREA_EDGES),
            "entering": int(len(rows)),
            "off_canvas": float((~on_canvas).mean()) if len(rows) else 0.0,
            "out_of_output": float((on_canvas & ~in_output).sum() / max(on_canvas.sum(), 1)),
            "clipped": float(clipped.sum() / max(in_output.sum(), 1)),
            "clipped_area_kept": float(ratio[clipped].mean()) if clipped.any() else float("nan"),
            "dropped": float((in_output & ~keep).sum() / max(in_output.sum(), 1)),
            "dropped_clipped": float((clipped & ~keep).sum() / max(clipped.sum(), 1)),
            "kept": int(keep.sum()),
            "scale_mean": float(np.nanmean(rows[:, 6])) if len(rows) else float("nan"),
            "scale_mean_dropped": float(np.nanmean(rows[in_output & ~keep, 6]))
            if (in_output & ~keep).any()
            else float("nan"),
        }
    return stats


def batches(samples: list[np.ndarray], batch: int) -> list[np.ndarray]:
    out = []
    for start in range(0, len(samples) - batch + 1, batch):
        chunk = [s.copy() for s in samples[start : start + batch]]
        for i, s in enumerate(chunk):
            s[:, 0] = i
        out.append(np.concatenate(chunk) if chunk else np.zeros((0, 6), np.float32))
    return out


def loss_stats(
    target_batches: list[np.ndarray], imgsz: int, batch: int, pred_sd: float, seed: int, hyp: dict
) -> dict:
    """Both losses on each batch's targets with the same predictions: positives per (level, anchor),
    objectness targets, and the largest difference between the two losses' (box, obj, cls) parts."""
    import torch
    import yolov5
    from yolov5.models.yolo import Model
    from yolov5.utils.loss import ComputeLoss
    from yolov5.utils.metrics import bbox_iou as release_iou

    from yolov5_smddp.detection.boxes import complete_iou
    from yolov5_smddp.detection.loss import LossHyp, YoloLoss, scale_loss_gains

    torch.manual_seed(seed)
    nc, nl = 3, 3
    model = Model(str(Path(yolov5.__file__).parent / "models" / "yolov5n.yaml"), ch=3, nc=nc)
    scaled = scale_loss_gains(hyp, nl, nc, imgsz)
    model.hyp = scaled
    detect = model.model[-1]
    theirs = ComputeLoss(model)
    ours = YoloLoss(
        SimpleNamespace(detect=SimpleNamespace(anchors=detect.anchors.detach().clone(), nc=nc, na=3, nl=nl)),
        LossHyp.from_mapping(scaled),
    )
    strides = [int(s) for s in detect.stride]
    gen = torch.Generator().manual_seed(seed)
    pos = {"release": np.zeros((nl, 3)), "ours": np.zeros((nl, 3))}
    obj = {"release": [[] for _ in range(nl)], "ours": [[] for _ in range(nl)]}
    cells = {"release": np.zeros(nl), "ours": np.zeros(nl)}
    max_diff = np.zeros(3)
    grad_diff = np.zeros(nl)  # largest |d loss / d preds| difference, relative to the release's largest
    rel_items, our_items = np.zeros(3), np.zeros(3)
    n_targets = 0
    for tb in target_batches:
        targets = torch.from_numpy(tb)
        n_targets += len(tb)
        preds = [
            torch.randn((batch, 3, imgsz // s, imgsz // s, 5 + nc), generator=gen) * pred_sd for s in strides
        ]
        for p in preds:
            p.requires_grad_(True)
        loss_r, items_r = theirs(preds, targets)
        grads_r = torch.autograd.grad(loss_r.sum(), preds)
        loss_o, items_o = ours(preds, targets)
        grads_o = torch.autograd.grad(loss_o.sum(), preds)
        preds = [p.detach() for p in preds]
        for level, (gr, go) in enumerate(zip(grads_r, grads_o)):
            scale = float(gr.abs().max().clamp(min=1e-30))
            grad_diff[level] = max(grad_diff[level], float((gr - go).abs().max()) / scale)
        rel_items += items_r.numpy()
        our_items += items_o.numpy()
        max_diff = np.maximum(max_diff, (items_r - items_o).abs().numpy())
        # the release's assignment, and the objectness targets its indices and CIoU give
        _, tbox, indices, anch = theirs.build_targets(preds, targets)
        for level in range(nl):
            b, a, gj, gi = indices[level]
            pos["release"][level] += np.bincount(a.numpy(), minlength=3)
            ps = preds[level][b, a, gj, gi]
            pxy = ps[:, :2].sigmoid() * 2 - 0.5
            pwh = (ps[:, 2:4].sigmoid() * 2) ** 2 * anch[level]
            iou = release_iou(torch.cat((pxy, pwh), 1), tbox[level], CIoU=True).squeeze(-1).clamp(min=0)
            tobj = torch.zeros(preds[level].shape[:4])
            tobj[b, a, gj, gi] = iou
            obj["release"][level].append(tobj[tobj > 0].numpy())
            cells["release"][level] += int((tobj > 0).sum())
        # ours: the candidates' mask and cells, the same CIoU formula (ours), written the same way
        layout = ours._layout(tuple((p.shape[2], p.shape[3]) for p in preds), batch, targets.device)
        cand = ours._candidates(targets, layout)
        for level in range(nl):
            v = cand["valid"][level]
            a = cand["a"][v]
            pos["ours"][level] += np.bincount(a.numpy(), minlength=3)
            b, gj, gi = cand["b"][v], cand["gj"][level][v], cand["gi"][level][v]
            ps = preds[level][b, a, gj, gi]
            pxy = ps[:, :2].sigmoid() * 2 - 0.5
            pwh = (ps[:, 2:4].sigmoid() * 2) ** 2 * cand["anchor_wh"][level][v]
            iou = complete_iou(torch.cat((pxy, pwh), 1), cand["tbox"][level][v]).reshape(-1).clamp(min=0)
            tobj = torch.zeros(preds[level].shape[:4])
            tobj[b, a, gj, gi] = iou
            obj["ours"][level].append(tobj[tobj > 0].numpy())
            cells["ours"][level] += int((tobj > 0).sum())
    n = max(len(target_batches), 1)
    return {
        "batches": len(target_batches),
        "targets": n_targets,
        "positives": pos,
        "cells": cells,
        "obj": {k: [np.concatenate(v) if v else np.zeros(0) for v in lv] for k, lv in obj.items()},
        "items": {"release": rel_items / n, "ours": our_items / n},
        "max_diff": max_diff,
        "grad_diff": grad_diff,
        "anchors_px": (detect.anchors * detect.stride.view(-1, 1, 1)).tolist(),
    }


def _fmt_hist(h: list[float]) -> str:
    return " ".join(f"{100 * v:.1f}" for v in h)


def markdown(stats: dict, losses: dict, args, names: list[str], seconds: dict) -> str:
    sides = list(stats)
    lines = [
        f"Pipeline statistics: {args.kind} data ({args.n_train} training images {args.width}x{args.height}, "
        f"seed {args.data_seed}), imgsz {args.imgsz}, scratch-low, mosaic on, {args.samples:,} samples "
        f"per pipeline (sampling seed {args.seed}); seconds: "
        + ", ".join(f"{k} {v:.0f}" for k, v in seconds.items()),
        "",
        "| quantity | class | " + " | ".join(sides) + " |",
        "|---|---|" + "---|" * len(sides),
    ]
    rows = [
        ("boxes per sample", "boxes_per_sample", "{:.3f}"),
        ("box width mean, px", "w_mean", "{:.1f}"),
        ("box height mean, px", "h_mean", "{:.1f}"),
        ("box area median, px²", "area_median", "{:.0f}"),
        ("boxes into the filter", "entering", "{:,}"),
        ("cut away by the mosaic canvas (zero size), % of those", "off_canvas", "pct"),
        ("outside the output, % of those on the canvas", "out_of_output", "pct"),
        ("clipped by the output border, % of those in the output", "clipped", "pct"),
        ("area kept by a clipped box, mean", "clipped_area_kept", "{:.3f}"),
        ("dropped by the filter, % of those in the output", "dropped", "pct"),
        ("dropped, % of the clipped", "dropped_clipped", "pct"),
        ("the affine's scale, mean over the boxes into the filter", "scale_mean", "{:.4f}"),
        ("the affine's scale, mean over the dropped boxes", "scale_mean_dropped", "{:.4f}"),
    ]
    for label, key, fmt in rows:
        for cls in [*range(len(names)), "all"]:
            cname = names[cls] if cls != "all" else "all"
            cells = []
            for side in sides:
                v = stats[side][cls][key]
                cells.append(f"{100 * v:.2f}" if fmt == "pct" else fmt.format(v))
            lines.append(f"| {label} | {cname} | " + " | ".join(cells) + " |")
    pixel_names = (
        "R mean",
        "G mean",
        "B mean",
        "std",
        "grey (R=G=B) fraction",
        "mean |neighbour difference|",
    )
    for k, name in enumerate(pixel_names):
        lines.append(
            f"| pixels (mean ± s.e. over samples): {name} | all | "
            + " | ".join(f"{stats[s]['pixels'][k]:.4f} ± {stats[s]['pixels_se'][k]:.4f}" for s in sides)
            + " |"
        )
    lines += [
        "",
        f"Histograms (% of the final boxes, all classes); width / height bins {list(WH_EDGES[:-1])}+ px, "
        "area bins their squares:",
        "",
        "| histogram | " + " | ".join(sides) + " |",
        "|---|" + "---|" * len(sides),
    ]
    for key in ("w_hist", "h_hist", "area_hist"):
        lines.append(f"| {key} | " + " | ".join(_fmt_hist(stats[s]["all"][key]) for s in sides) + " |")
    for cls in range(len(names)):
        lines.append(
            f"| area_hist {names[cls]} | "
            + " | ".join(_fmt_hist(stats[s][cls]["area_hist"]) for s in sides)
            + " |"
        )
    for source, loss in losses.items():
        lines += [
            "",
            f"Target assignment on the {source} pipeline's batches ({loss['batches']} batches of {args.batch}, "
            f"{loss['targets']:,} targets), identical targets and predictions (normal logits, sd {args.pred_sd}) "
            "to both losses; anchors (px) "
            + str([[round(v) for v in a] for lv in loss["anchors_px"] for a in lv]),
            "",
            "| quantity | level | release | ours |",
            "|---|---|---|---|",
        ]
        for level in range(3):
            for a in range(3):
                r, o = loss["positives"]["release"][level][a], loss["positives"]["ours"][level][a]
                lines.append(
                    f"| positives per batch, anchor {a} | P{level + 3} | {r / loss['batches']:.2f} | {o / loss['batches']:.2f} |"
                )
            r, o = loss["cells"]["release"][level], loss["cells"]["ours"][level]
            lines.append(
                f"| objectness cells > 0 per batch | P{level + 3} | {r / loss['batches']:.2f} | {o / loss['batches']:.2f} |"
            )
            ro, oo = loss["obj"]["release"][level], loss["obj"]["ours"][level]
            lines.append(f"| objectness target mean | P{level + 3} | {ro.mean():.4f} | {oo.mean():.4f} |")
            lines.append(
                f"| objectness target histogram {list(OBJ_EDGES[:-1])}+, % | P{level + 3} | {_fmt_hist(_hist(ro, OBJ_EDGES))} | "
                f"{_fmt_hist(_hist(oo, OBJ_EDGES))} |"
            )
        ri, oi = loss["items"]["release"], loss["items"]["ours"]
        lines.append(
            "| loss parts (box, obj, cls), mean per batch | all | "
            + " ".join(f"{v:.6f}" for v in ri)
            + " | "
            + " ".join(f"{v:.6f}" for v in oi)
            + " |"
        )
        lines.append(
            f"| largest per-batch difference (box, obj, cls) | all | {' '.join(f'{v:.2e}' for v in loss['max_diff'])} | |"
        )
        lines.append(
            "| largest gradient difference w.r.t. the predictions, relative to the largest gradient, per level | "
            f"all | {' '.join(f'{v:.2e}' for v in loss['grad_diff'])} | |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=("textured", "shapes"), default="textured")
    parser.add_argument("--samples", type=int, default=10_000)
    parser.add_argument("--imgsz", type=int, default=256)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--n-train", type=int, default=1000)
    parser.add_argument("--width", type=int, default=320)
    parser.add_argument("--height", type=int, default=240)
    parser.add_argument("--data-seed", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pred-sd", type=float, default=0.5)
    parser.add_argument("--sides", default="release,ours")
    parser.add_argument("--out", type=Path, default=None, help="also write the markdown table here")
    args = parser.parse_args()

    import cv2
    import torch
    import yaml
    import yolov5  # the release, only in a throwaway environment
    from yolov5.utils.dataloaders import LoadImagesAndLabels

    from yolov5_smddp.data.config import load_data_config
    from yolov5_smddp.data.dataset import YoloDataset
    from yolov5_smddp.data.labels import build_label_index

    cv2.setNumThreads(1)
    torch.set_num_threads(1)
    hyp = yaml.safe_load((Path(yolov5.__file__).parent / "data/hyps/hyp.scratch-low.yaml").read_text())
    stats, samples, seconds = {}, {}, {}
    with tempfile.TemporaryDirectory(prefix="pipeline-stats-") as tmp:
        root = Path(tmp) / "data"
        if args.kind == "textured":
            from bench.make_textured_dataset import make_textured_dataset as make
        else:
            from yolov5_smddp.data.synthetic import make_shapes_dataset as make
        yaml_path = make(
            root, n_train=args.n_train, n_val=0, width=args.width, height=args.height, seed=args.data_seed
        )
        cfg = load_data_config(yaml_path)
        names = list(cfg.names)
        train_dir = str(cfg.train[0]) if isinstance(cfg.train, list | tuple) else str(cfg.train)
        for side in args.sides.split(","):
            log = FilterLog()
            started = time.perf_counter()
            if side == "release":
                instrument_release(log)
                random.seed(args.seed)
                np.random.seed(args.seed)
                dataset = LoadImagesAndLabels(
                    train_dir, img_size=args.imgsz, batch_size=args.batch, augment=True, hyp=hyp
                )
            else:
                instrument_ours(log)
                index = build_label_index(
                    cfg.train, nc=cfg.nc, root=cfg.root, cache_dir=Path(tmp) / "c", workers=1
                )
                dataset = YoloDataset(index, args.imgsz, augment=True, hyp=hyp, seed=args.seed)
            samples[side], pixels = draw_samples(dataset, args.samples, args.seed)
            seconds[side] = time.perf_counter() - started
            stats[side] = sample_stats(samples[side], log.table(), args.imgsz, cfg.nc)
            stats[side]["pixels"] = pixels.mean(0).tolist()
            stats[side]["pixels_se"] = (pixels.std(0) / np.sqrt(max(len(pixels), 1))).tolist()
            print(f"{side}: {len(samples[side])} samples in {seconds[side]:.0f} s", file=sys.stderr)
    losses = {}
    for side, side_samples in samples.items():
        started = time.perf_counter()
        losses[side] = loss_stats(
            batches(side_samples, args.batch), args.imgsz, args.batch, args.pred_sd, args.seed, hyp
        )
        seconds[f"losses on {side}'s batches"] = time.perf_counter() - started
    text = markdown(stats, losses, args, names, seconds)
    print(text)
    if args.out is not None:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
