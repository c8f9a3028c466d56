"""The plots a run leaves in the output folder (rank 0; SageMaker uploads them in output.tar.gz), under the
release's file names: results.png, confusion_matrix.png, PR_curve.png, F1_curve.png, P_curve.png,
R_curve.png, labels.jpg, train_batch0..2.jpg, val_batch0_labels.jpg / val_batch0_pred.jpg.

Numbers come from pure functions (confusion.py, curves.py); drawing from render.py (matplotlib, Agg) and
mosaic.py (OpenCV). Every file is written atomically, and a plot that fails logs a warning and never fails
the run (`write_safely`).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import cv2
import numpy as np
import torch

from yolov5_smddp.data.color import apply_color
from yolov5_smddp.data.decode import ImageProblem, decode_image
from yolov5_smddp.detection.boxes import xywh_to_xyxy
from yolov5_smddp.detection.metrics import match_predictions
from yolov5_smddp.distributed import collectives, process_group
from yolov5_smddp.plots.confusion import ConfusionMatrix
from yolov5_smddp.plots.curves import Curves, compute_curves
from yolov5_smddp.plots.mosaic import MAX_IMAGES, batch_mosaic, training_batch_boxes, write_jpeg

log = logging.getLogger(__name__)

IOU50 = torch.tensor([0.5])


def write_safely(name: str, fn: Callable[[], object]) -> bool:
    """Run one plot; any failure (matplotlib missing, a bad value, a full disk) is a warning."""
    try:
        fn()
    except Exception as exc:  # plots are a convenience: never the reason a training job fails
        log.warning("plot %s not written (%s: %s)", name, type(exc).__name__, exc)
        return False
    return True


class ValidationPlots:
    """Collects what the validation plots need through `evaluate(on_image=...)`: detections [n, 6]
    (x1, y1, x2, y2 original pixels, score, class) per image, matched here against the split's labels.

    Sharded validation: every rank records its own shard, then every rank calls `gather()`; rank 0's
    recorder then holds the confusion matrix and curve statistics of ALL images. The val_batch0 images
    (`first`) are rank 0's own first images (`keep_first=False` on the other ranks)."""

    def __init__(
        self,
        images: Sequence[Path],
        shapes: np.ndarray,
        labels: Sequence[np.ndarray],
        nc: int,
        *,
        keep_first: bool = True,
    ) -> None:
        self._keep_first = keep_first
        self._lookup = {str(p): i for i, p in enumerate(images)}
        self._shapes, self._labels = shapes, labels
        self.confusion = ConfusionMatrix(nc)
        self._correct: list[np.ndarray] = []
        self._conf: list[np.ndarray] = []
        self._pred_cls: list[np.ndarray] = []
        self._target_cls: list[np.ndarray] = []
        self.first: list[tuple[str, np.ndarray, np.ndarray]] = []  # (path, gt [m, 5], dets [n, 6])

    def on_image(self, path: str, detections: torch.Tensor) -> None:
        i = self._lookup.get(str(path))
        if i is None:
            return
        h, w = (int(v) for v in self._shapes[i])
        labels = torch.from_numpy(np.asarray(self._labels[i], dtype=np.float32).reshape(-1, 5))
        gt_cls = labels[:, 0]
        gt_boxes = xywh_to_xyxy(labels[:, 1:5]) * torch.tensor([w, h, w, h], dtype=torch.float32)
        dets = detections.detach().float().cpu()
        correct = match_predictions(dets[:, :4], dets[:, 4], dets[:, 5], gt_boxes, gt_cls, IOU50)
        self._correct.append(correct[:, 0].numpy())
        self._conf.append(dets[:, 4].numpy())
        self._pred_cls.append(dets[:, 5].numpy())
        self._target_cls.append(gt_cls.numpy())
        self.confusion.update(dets, gt_cls, gt_boxes)
        if self._keep_first and len(self.first) < MAX_IMAGES:
            gt = torch.cat([gt_cls[:, None], gt_boxes], 1).numpy()
            self.first.append(
                (str(path), gt, dets[dets[:, 4] > self.confusion.conf][:, [5, 0, 1, 2, 3, 4]].numpy())
            )

    def _statistics(self) -> tuple[np.ndarray, np.ndarray]:
        """detections [N, 3] (correct at IoU 0.5 as 0/1, conf, class) and target classes [M], float32."""

        def cat(parts: list[np.ndarray]) -> np.ndarray:
            return np.concatenate(parts).astype(np.float32) if parts else np.zeros(0, np.float32)

        detections = np.stack([cat(self._correct), cat(self._conf), cat(self._pred_cls)], axis=1)
        return detections, cat(self._target_cls)

    def gather(self) -> None:
        """Collective (every rank, after a sharded `evaluate`): on rank 0 the statistics and the confusion
        matrix become those of every rank's images, in rank order; the other ranks keep their own. Exact:
        flags and classes are small integers, conf is float32 already. Alone: nothing to do."""
        if not process_group.is_initialized():
            return
        detections, target_cls = self._statistics()
        all_detections = collectives.all_gather_rows(torch.from_numpy(detections))
        all_targets = collectives.all_gather_rows(torch.from_numpy(target_cls).view(-1, 1))
        matrices = collectives.all_gather_rows(torch.from_numpy(self.confusion.matrix))
        if not process_group.is_main():
            return
        merged = torch.cat(all_detections).numpy()
        self._correct, self._conf, self._pred_cls = [merged[:, 0] > 0.5], [merged[:, 1]], [merged[:, 2]]
        self._target_cls = [torch.cat(all_targets).numpy().reshape(-1)]
        self.confusion.matrix = torch.stack(matrices).sum(0).numpy()

    def curves(self) -> Curves:
        detections, target_cls = self._statistics()
        return compute_curves(detections[:, 0] > 0.5, detections[:, 1], detections[:, 2], target_cls)


@functools.cache
def _render():
    """The matplotlib half (None, with one warning per process, when matplotlib is not installed)."""
    try:
        from yolov5_smddp.plots import render  # matplotlib is optional: imported on first use
    except ImportError as exc:
        log.warning("plots: charts skipped, matplotlib cannot be imported (%s)", exc)
        return None
    return render


def write_validation_plots(folder: Path, recorder: ValidationPlots, names: Sequence[str]) -> float:
    """confusion_matrix.png, PR/F1/P/R curves and val_batch0_{labels,pred}.jpg; returns the seconds spent."""
    started = time.perf_counter()
    if recorder.first:
        write_safely("val_batch0", lambda: _write_val_batch(folder, recorder, names))
    render = _render()
    if render is None:
        return time.perf_counter() - started
    curves = recorder.curves()
    write_safely("PR_curve.png", lambda: render.plot_pr_curve(curves, names, folder / "PR_curve.png"))
    for which, file in (("f1", "F1_curve.png"), ("precision", "P_curve.png"), ("recall", "R_curve.png")):
        write_safely(file, lambda w=which, f=file: render.plot_metric_curve(curves, names, folder / f, w))
    write_safely(
        "confusion_matrix.png",
        lambda: render.plot_confusion_matrix(
            recorder.confusion.normalised(), names, folder / "confusion_matrix.png"
        ),
    )
    return time.perf_counter() - started


def _image_or_none(path: str):
    """BGR [h, w, 3] of `path`, None when it cannot be decoded. Not cv2.imread: OpenCV's binding crashes
    (SIGSEGV) on a path whose name is not UTF-8."""
    try:
        return decode_image(path)
    except ImageProblem:
        return None


def _write_val_batch(folder: Path, recorder: ValidationPlots, names: Sequence[str]) -> None:
    images = [_image_or_none(path) for path, _, _ in recorder.first]
    kept = [(im, gt, det) for im, (_, gt, det) in zip(images, recorder.first) if im is not None]
    write_jpeg(
        folder / "val_batch0_labels.jpg", batch_mosaic([k[0] for k in kept], [k[1] for k in kept], names)
    )
    write_jpeg(
        folder / "val_batch0_pred.jpg", batch_mosaic([k[0] for k in kept], [k[2] for k in kept], names)
    )


def write_results_plot(folder: Path, rows: Sequence[dict]) -> bool:
    render = _render()
    return render is not None and write_safely(
        "results.png", lambda: render.plot_results(rows, folder / "results.png")
    )


def write_labels_plot(folder: Path, labels: Sequence[np.ndarray], names: Sequence[str]) -> bool:
    render = _render()
    return render is not None and write_safely(
        "labels.jpg", lambda: render.plot_labels(labels, names, folder / "labels.jpg")
    )


def after_epoch(
    folder: Path, rows: Sequence[dict], recorder: ValidationPlots | None, names: Sequence[str]
) -> float:
    """results.png, and the validation plots when this epoch validated; returns the seconds spent
    (logged at debug level; the cost stays under a few seconds per epoch)."""
    started = time.perf_counter()
    write_results_plot(folder, rows)
    if recorder is not None:
        write_safely("validation plots", lambda: write_validation_plots(folder, recorder, names))
    seconds = time.perf_counter() - started
    log.debug("plots written in %.2f s", seconds)
    return seconds


TRAIN_BATCHES = 3


def recording_batches(
    loader: Iterable, folder: Path, names: Sequence[str], count: int = TRAIN_BATCHES
) -> Iterator:
    """`loader`'s batches unchanged; the first `count` are also drawn to train_batch{i}.jpg (the
    augmented images with their boxes, as the model sees them)."""
    for i, batch in enumerate(loader):
        if i < count:
            write_safely(
                f"train_batch{i}.jpg",
                lambda b=batch, k=i: _write_train_batch(folder / f"train_batch{k}.jpg", b, names),
            )
        yield batch


def _write_train_batch(path: Path, batch, names: Sequence[str]) -> None:
    imgs, targets = batch[0][:MAX_IMAGES], batch[1]
    color = batch[4]
    if color is not None:  # HSV and flips left to the device batch: draw what the model will see
        imgs = apply_color(imgs, color[:MAX_IMAGES])
    images = [cv2.cvtColor(im.permute(1, 2, 0).cpu().numpy(), cv2.COLOR_RGB2BGR) for im in imgs[:MAX_IMAGES]]
    targets = targets.cpu().numpy()
    boxes = [training_batch_boxes(targets, i, im.shape[0], im.shape[1]) for i, im in enumerate(images)]
    write_jpeg(path, batch_mosaic(images, boxes, names))


TENSORBOARD_IMAGES = (
    "results.png",
    "confusion_matrix.png",
    "PR_curve.png",
    "F1_curve.png",
    "labels.jpg",
    "train_batch0.jpg",
    "val_batch0_pred.jpg",
)


def add_to_tensorboard(board, folder: Path, step: int) -> int:
    """The plot images present in `folder` as TensorBoard images at `step`; returns how many."""
    added = 0
    for name in TENSORBOARD_IMAGES:
        image = cv2.imread(str(folder / name)) if (folder / name).is_file() else None
        if image is not None:
            rgb = cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
            if write_safely(
                f"TensorBoard {name}", lambda n=name, im=rgb: board.add_image(n, im, step, dataformats="HWC")
            ):
                added += 1
    return added
