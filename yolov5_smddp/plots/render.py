"""Charts with matplotlib (Agg backend: no display, safe in worker threads of a headless job), each saved
atomically so a reader (S3 sync, a person refreshing) never sees a partial file."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 (after choosing the backend)
import numpy as np  # noqa: E402
from matplotlib.collections import LineCollection  # noqa: E402

from yolov5_smddp.files.atomic import atomic_write  # noqa: E402
from yolov5_smddp.plots.curves import GRID, Curves  # noqa: E402

MAX_LEGEND_CLASSES = 20  # more classes: thin grey lines without a legend entry each
RESULT_PANELS = (
    ("box_loss", "train box loss"),
    ("obj_loss", "train obj loss"),
    ("cls_loss", "train cls loss"),
    ("precision", "precision"),
    ("recall", "recall"),
    ("mAP50", "mAP50"),
    ("mAP50-95", "mAP50-95"),
    ("fitness", "fitness"),
    ("lr_weight", "learning rate"),
    ("samples_per_sec", "samples/s"),
)


def save_figure(fig, path: Path, dpi: int = 100) -> Path:
    buffer = io.BytesIO()
    fig.savefig(buffer, format=path.suffix.lstrip(".").lower() or "png", dpi=dpi)
    plt.close(fig)
    with atomic_write(path) as handle:
        handle.write(buffer.getvalue())
    return path


def _class_lines(ax, x: np.ndarray, ys: np.ndarray, labels: Sequence[str]) -> None:
    if len(labels) <= MAX_LEGEND_CLASSES:
        for y, label in zip(ys, labels):
            ax.plot(x, y, linewidth=1, label=label)
    elif len(ys):  # one collection: much faster than a line per class for COCO's 80
        ax.add_collection(
            LineCollection([np.column_stack([x, y]) for y in ys], colors="grey", linewidths=0.5)
        )


def plot_pr_curve(curves: Curves, names: Sequence[str], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(9, 6), tight_layout=True)
    labels = [f"{_name(names, c)} {ap:.3f}" for c, ap in zip(curves.classes, curves.ap50)]
    _class_lines(ax, GRID, curves.pr, labels)
    if len(curves.classes):
        mean = curves.pr.mean(0)
        ax.plot(GRID, mean, linewidth=3, color="blue", label=f"all classes {curves.ap50.mean():.3f} mAP@0.5")
    _frame(ax, "Recall", "Precision", "Precision-Recall Curve")
    return save_figure(fig, path)


def plot_metric_curve(curves: Curves, names: Sequence[str], path: Path, which: str) -> Path:
    """`which` in ("f1", "precision", "recall") against confidence; the all-classes line's best point
    (max for F1, at that confidence) in the legend."""
    ys = getattr(curves, which)
    title = {"f1": "F1", "precision": "Precision", "recall": "Recall"}[which]
    fig, ax = plt.subplots(figsize=(9, 6), tight_layout=True)
    _class_lines(ax, GRID, ys, [_name(names, c) for c in curves.classes])
    if len(curves.classes):
        mean = ys.mean(0)
        best = int(curves.f1.mean(0).argmax())
        ax.plot(
            GRID, mean, linewidth=3, color="blue", label=f"all classes {mean[best]:.2f} at {GRID[best]:.3f}"
        )
    _frame(ax, "Confidence", title, f"{title}-Confidence Curve")
    return save_figure(fig, path)


def _frame(ax, xlabel: str, ylabel: str, title: str) -> None:
    ax.set(xlim=(0, 1), ylim=(0, 1.01), xlabel=xlabel, ylabel=ylabel, title=title)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(bbox_to_anchor=(1.04, 1), loc="upper left", fontsize=8)


def plot_confusion_matrix(normalised: np.ndarray, names: Sequence[str], path: Path) -> Path:
    n = normalised.shape[0]
    labels = [*[_name(names, i) for i in range(n - 1)], "background"]
    size = min(max(6.0, 0.3 * n + 3), 12.0)
    fig, ax = plt.subplots(figsize=(size, size * 0.8), tight_layout=True)
    shown = np.where(normalised < 0.005, np.nan, normalised)  # empty cells blank, not dark
    image = ax.imshow(shown, cmap="Blues", vmin=0, vmax=1)
    fig.colorbar(image, ax=ax, fraction=0.046)
    if n <= 31:
        ax.set_xticks(range(n), labels, rotation=90, fontsize=8)
        ax.set_yticks(range(n), labels, fontsize=8)
        for (i, j), v in np.ndenumerate(normalised):
            if v >= 0.005:
                ax.text(
                    j,
                    i,
                    f"{v:.2f}",
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="white" if v > 0.5 else "black",
                )
    ax.set(xlabel="True", ylabel="Predicted", title="Confusion Matrix (normalised by true class)")
    return save_figure(fig, path)


def plot_results(rows: Sequence[dict], path: Path) -> Path:
    """results.csv rows (one per epoch) → one panel per column that has values."""
    panels = [(key, title) for key, title in RESULT_PANELS if any(key in r and r[key] != "" for r in rows)]
    cols = 5
    fig, axes = plt.subplots(2, cols, figsize=(15, 6))
    fig.subplots_adjust(left=0.04, right=0.99, bottom=0.07, top=0.93, wspace=0.3, hspace=0.35)
    for ax, (key, title) in zip(axes.ravel(), panels):
        pts = [(float(r["epoch"]), float(r[key])) for r in rows if key in r and r[key] != ""]
        ax.plot(*zip(*pts), marker=".", linewidth=2, markersize=6)
        ax.set_title(title, fontsize=11)
    for ax in axes.ravel()[len(panels) :]:
        ax.axis("off")
    return save_figure(fig, path)


def plot_labels(labels: Sequence[np.ndarray], names: Sequence[str], path: Path) -> Path:
    """Per-image float [n, 5] (cls, xc, yc, w, h) normalised → class histogram, box centres, box sizes."""
    table = np.concatenate(
        [np.asarray(lab, dtype=np.float64).reshape(-1, 5) for lab in labels] or [np.zeros((0, 5))]
    )
    nc = max(len(names), int(table[:, 0].max()) + 1 if len(table) else 1)
    fig, axes = plt.subplots(1, 3, figsize=(15, 5), tight_layout=True)
    counts = np.bincount(table[:, 0].astype(np.int64), minlength=nc)
    axes[0].bar(range(nc), counts, color="steelblue")
    if nc <= 30:
        axes[0].set_xticks(range(nc), [_name(names, i) for i in range(nc)], rotation=90, fontsize=8)
    axes[0].set(ylabel="instances", title=f"{len(table)} boxes in {len(labels)} images")
    axes[1].hist2d(table[:, 1], table[:, 2], bins=50, range=[[0, 1], [0, 1]], cmap="Blues")
    axes[1].set(xlabel="x", ylabel="y", title="box centres", xlim=(0, 1), ylim=(1, 0))
    axes[2].hist2d(table[:, 3], table[:, 4], bins=50, range=[[0, 1], [0, 1]], cmap="Blues")
    axes[2].set(xlabel="width", ylabel="height", title="box sizes (fraction of the image)")
    return save_figure(fig, path, dpi=100)


def _name(names: Sequence[str], c: int) -> str:
    c = int(c)
    return names[c] if 0 <= c < len(names) else str(c)
