"""The options of the tiny CPU training runs the tests start: yolov5n at 64 px, a small batch, no loader
workers, and the run's four folders under one `out` folder (model/, output/, ckpt/, cache/)."""

from __future__ import annotations

from pathlib import Path


def run_folders(out: Path) -> list[str]:
    """--model-dir out/model --output-dir out/output --checkpoint-dir out/ckpt --cache-dir out/cache."""
    return [
        "--model-dir", str(out / "model"), "--output-dir", str(out / "output"),
        "--checkpoint-dir", str(out / "ckpt"), "--cache-dir", str(out / "cache"),
    ]  # fmt: skip


def tiny_training(
    out: Path, data: Path, *extra: str, imgsz: int = 64, batch_size: int = 8, workers: int | None = 0
) -> list[str]:
    """`train` options (no command word): --cfg yolov5n --data `data` --imgsz --batch-size, --workers (left
    out for None: the trainer's default), the folders of `run_folders(out)`, then `extra` (an option given
    again there wins: argparse keeps the last)."""
    options = [
        "--cfg",
        "yolov5n",
        "--data",
        str(data),
        "--imgsz",
        str(imgsz),
        "--batch-size",
        str(batch_size),
    ]
    if workers is not None:
        options += ["--workers", str(workers)]
    return [*options, *run_folders(out), *extra]
