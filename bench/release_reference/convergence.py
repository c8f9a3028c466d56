"""Helpers of bench/convergence.sh (run inside its throwaway image, this checkout on PYTHONPATH).

  convergence.py data DIR [--kind shapes|textured --n-train N --n-val N --width W --height H --seed S]
      write the task under DIR (shapes: yolov5_smddp.data.synthetic.make_shapes_dataset; textured:
      bench/make_textured_dataset.py, issue 38) and a data.yaml with an absolute `path` (the release
      resolves a relative one against its own install folder).
  convergence.py hyp OUT KEY=VALUE,...
      the release's scratch-low hyperparameters with those replaced, as a YAML file for its --hyp.
  convergence.py score RUN_DIR LOG
      read `yolov5-smddp val`'s metric line from LOG into RUN_DIR/score.json.
  convergence.py table OUT_DIR
      print (and write OUT_DIR/table.md) the per-epoch mAP curves, the final scores of each run's best.pt
      by OUR val, wall times, and per variant the mean and the seed spread (min..max).

Each run folder OUT_DIR/runs/<variant>-s<seed>/ holds meta.json (variant, seed, wall_s), the trainer's
results.csv (ours: output/results.csv; the release: its own results.csv) and score.json.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import statistics
import sys
from pathlib import Path

DATA_KINDS = ("shapes", "textured")
_METRIC = re.compile(r"(?<![\w-])(mAP50-95|mAP50)=([0-9.]+(?:[eE][-+]?[0-9]+)?)")


def _data(args: argparse.Namespace) -> int:
    from yolov5_smddp.data.synthetic import make_shapes_dataset

    make = make_shapes_dataset
    if args.kind == "textured":
        from bench.make_textured_dataset import make_textured_dataset as make
    root = Path(args.dir).resolve()
    yaml_path = make(
        root, n_train=args.n_train, n_val=args.n_val, width=args.width, height=args.height, seed=args.seed
    )
    text = yaml_path.read_text().replace("path: .\n", f"path: {root}\n", 1)
    yaml_path.write_text(text)
    print(yaml_path)
    return 0


def _hyp(args: argparse.Namespace) -> int:
    """The release's scratch-low hyperparameters with `key=value,...` replaced, as a YAML file for its
    --hyp (ours takes the same string as --hyp-override)."""
    import yaml
    import yolov5  # the release, only in the throwaway image

    hyp = yaml.safe_load((Path(yolov5.__file__).parent / "data/hyps/hyp.scratch-low.yaml").read_text())
    for item in filter(None, args.overrides.split(",")):
        key, value = item.split("=", 1)
        if key not in hyp:
            print(f"unknown hyperparameter {key!r}", file=sys.stderr)
            return 2
        hyp[key] = float(value)
    Path(args.out).write_text(yaml.safe_dump(hyp, sort_keys=False))
    return 0


def _score(args: argparse.Namespace) -> int:
    text = Path(args.log).read_text(errors="replace")
    found: dict[str, float] = {}
    for line in text.splitlines():
        if "pycocotools=" in line:
            continue  # the val line itself comes first; pycocotools' line (if any) is reported apart
        for key, value in _METRIC.findall(line):
            found[key] = float(value)
    if set(found) != {"mAP50", "mAP50-95"}:
        print(f"no mAP50 / mAP50-95 metric line in {args.log}", file=sys.stderr)
        return 1
    (Path(args.run_dir) / "score.json").write_text(json.dumps(found))
    return 0


_SERIES = {  # name: (our output/results.csv column, the release's results.csv column)
    "mAP50-95": ("mAP50-95", "metrics/mAP_0.5:0.95"),
    "box": ("box_loss", "train/box_loss"),
    "obj": ("obj_loss", "train/obj_loss"),
    "cls": ("cls_loss", "train/cls_loss"),
}


def _series(run: Path, name: str) -> list[float]:
    """One per-epoch column of the trainer's own results (ours: output/results.csv; the release:
    results.csv with space-padded headers): mAP50-95 of its validation, or a training loss."""
    for path, key in zip((run / "output" / "results.csv", run / "results.csv"), _SERIES[name]):
        if path.is_file():
            with path.open(newline="") as handle:
                rows = [{k.strip(): v.strip() for k, v in row.items() if k} for row in csv.DictReader(handle)]
            return [float(r[key]) for r in rows if r.get(key)]
    return []


def _curve(run: Path) -> list[float]:
    return _series(run, "mAP50-95")


def _train_loss(run: Path) -> list[float]:
    """Training loss per epoch (box + obj + cls, each the epoch's mean, as both trainers log them)."""
    parts = [_series(run, name) for name in ("box", "obj", "cls")]
    return [sum(v) for v in zip(*parts)]


def _curves_side_by_side(
    runs: list[dict],
    key: str = "curve",
    title: str = "mAP50-95 by epoch (own validation)",
    every: int = 3,
    tail: int = 5,
) -> list[str]:
    """A per-epoch series (`key` of each run) of every run and of each variant's mean over its seeds, every
    `every`-th epoch (4, 7, 10, ...), and the mean of the last `tail` epochs: where curves cross."""
    length = max((len(r[key]) for r in runs), default=0)
    if not length:
        return []
    epochs = list(range(1 + every, length + 1, every)) or [length]  # 4, 7, 10, ... as in issue 27
    header = "| run | " + " | ".join(str(e) for e in epochs) + f" | last {tail} mean |"
    lines = [
        f"{title}, side by side:",
        "",
        header,
        "|---" * (len(epochs) + 2) + "|",
    ]

    def row(name: str, curve: list[float]) -> str:
        cells = [f"{curve[e - 1]:.3f}" if e <= len(curve) else "" for e in epochs]
        last = f"{statistics.mean(curve[-tail:]):.3f}" if curve else ""
        return f"| {name} | " + " | ".join(cells) + f" | {last} |"

    by_variant: dict[str, list[list[float]]] = {}
    for r in sorted(runs, key=lambda r: (r["seed"], r["variant"])):
        lines.append(row(f"{r['variant']}, seed {r['seed']}", r[key]))
        if len(r[key]) == length:
            by_variant.setdefault(r["variant"], []).append(r[key])
    for variant, curves in by_variant.items():
        mean = [statistics.mean(c[i] for c in curves) for i in range(length)]
        lines.append(row(f"**{variant}, mean of {len(curves)}**", mean))
    return lines


def _table(args: argparse.Namespace) -> int:
    out = Path(args.out_dir)
    runs = []
    for meta_path in sorted(out.glob("runs/*/meta.json")):
        meta = json.loads(meta_path.read_text())
        score_path = meta_path.parent / "score.json"
        score = json.loads(score_path.read_text()) if score_path.is_file() else {}
        run = meta_path.parent
        runs.append({**meta, **score, "curve": _curve(run), "train_loss": _train_loss(run)})
    if not runs:
        print(f"no runs under {out}/runs", file=sys.stderr)
        return 1
    lines = [
        "| variant | seed | mAP50-95 | mAP50 | wall min | mAP50-95 per epoch (own val) |",
        "|---|---|---|---|---|---|",
    ]
    for r in runs:
        curve = " ".join(f"{v:.4f}" for v in r["curve"])
        lines.append(
            f"| {r['variant']} | {r['seed']} | {r.get('mAP50-95', float('nan')):.4f} | "
            f"{r.get('mAP50', float('nan')):.4f} | {r['wall_s'] / 60:.1f} | {curve} |"
        )
    lines += [
        "",
        "| variant | runs | mAP50-95 mean (min..max) | mAP50 mean (min..max) | wall min mean |",
        "|---|---|---|---|---|",
    ]
    for variant in dict.fromkeys(r["variant"] for r in runs):
        mine = [r for r in runs if r["variant"] == variant and "mAP50-95" in r]
        if not mine:
            continue
        a, b = [r["mAP50-95"] for r in mine], [r["mAP50"] for r in mine]
        lines.append(
            f"| {variant} | {len(mine)} | {statistics.mean(a):.4f} ({min(a):.4f}..{max(a):.4f}) | "
            f"{statistics.mean(b):.4f} ({min(b):.4f}..{max(b):.4f}) | "
            f"{statistics.mean(r['wall_s'] for r in mine) / 60:.1f} |"
        )
    lines += ["", *_curves_side_by_side(runs)]
    lines += ["", *_curves_side_by_side(runs, "train_loss", "Training loss (box + obj + cls) by epoch")]
    text = "\n".join(lines) + "\n"
    (out / "table.md").write_text(text)
    print(text)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    data = sub.add_parser("data")
    data.add_argument("dir")
    data.add_argument("--kind", choices=DATA_KINDS, default="shapes")
    data.add_argument("--n-train", type=int, default=400)
    data.add_argument("--n-val", type=int, default=100)
    data.add_argument("--width", type=int, default=256)
    data.add_argument("--height", type=int, default=192)
    data.add_argument("--seed", type=int, default=0)
    hyp = sub.add_parser("hyp")
    hyp.add_argument("out")
    hyp.add_argument("overrides")
    score = sub.add_parser("score")
    score.add_argument("run_dir")
    score.add_argument("log")
    table = sub.add_parser("table")
    table.add_argument("out_dir")
    args = parser.parse_args()
    return {"data": _data, "hyp": _hyp, "score": _score, "table": _table}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
