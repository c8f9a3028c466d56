"""Shared by the export / serving tests: a test scene, detection comparison, and running the model
folder's code/inference.py the way SageMaker's PyTorch serving toolkit does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import cv2
import numpy as np


def scene_image(path, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 255, (180, 260, 3), dtype=np.uint8)
    for _ in range(6):
        x, y = rng.integers(0, 200), rng.integers(0, 120)
        cv2.rectangle(
            image, (int(x), int(y)), (int(x) + 50, int(y) + 40), rng.integers(0, 255, 3).tolist(), -1
        )
    cv2.imwrite(str(path), image)


def randomise_batchnorm(model) -> None:
    """BatchNorm statistics and affine terms that are not the identity, so that export's folding of them is
    tested (a freshly built model's would fold to nothing)."""
    import torch

    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.uniform_(-0.2, 0.2)
                module.running_var.uniform_(0.5, 2.0)
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.2, 0.2)


def assert_same_detections(got: dict, want: dict, px: float = 1.0, *, ties_at_the_cut: bool = False) -> None:
    """Same image size and the same detections, paired one to one (the same class, score within 1e-3,
    box within `px` pixels); order may differ among equal scores. With `ties_at_the_cut` (both sides cut at
    --max-det among near-equal scores, as an untrained model gives), boxes left unpaired are allowed only at
    the cut: within 1e-4 of the lowest score kept, on both sides."""
    assert (got["width"], got["height"]) == (want["width"], want["height"])
    assert len(got["detections"]) == len(want["detections"])
    unmatched = list(want["detections"])
    extra = []
    for a in got["detections"]:
        match = next(
            (
                b
                for b in unmatched
                if (a["class_id"], a["class_name"]) == (b["class_id"], b["class_name"])
                and abs(a["score"] - b["score"]) < 1e-3
                and max(abs(u - v) for u, v in zip(a["box_xyxy"], b["box_xyxy"])) <= px
            ),
            None,
        )
        if match is None:
            extra.append(a)
            continue
        unmatched.remove(match)
    if not extra:
        return
    assert ties_at_the_cut, f"{extra[0]} has no counterpart in {unmatched}"
    floor = min(d["score"] for d in got["detections"] + want["detections"])
    off_the_cut = [d for d in extra + unmatched if d["score"] - floor >= 1e-4]
    assert not off_the_cut, f"unpaired above the cut (lowest score {floor}): {off_the_cut}"


# Runs code/inference.py as SageMaker's PyTorch serving toolkit does, in a process where the package
# cannot be imported (not on the path, and blocked in sys.modules in case it is installed).
HANDLER_RUN = textwrap.dedent(
    """
    import json, sys
    sys.modules["yolov5_smddp"] = None
    try:
        import yolov5_smddp
    except ImportError:
        pass
    else:
        raise SystemExit("yolov5_smddp importable")
    model_dir, request, content_type = sys.argv[1:4]
    sys.path.insert(0, model_dir + "/code")
    import inference
    model = inference.model_fn(model_dir)
    with open(request, "rb") as handle:
        body = handle.read()
    data = inference.input_fn(body, content_type)
    print(inference.output_fn(inference.predict_fn(data, model), "application/json"))
    """
)


def run_handler(model_dir: Path, request: Path, content_type: str, **env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    proc = subprocess.run(
        [sys.executable, "-c", HANDLER_RUN, str(model_dir), str(request), content_type],
        env={**clean, "OMP_NUM_THREADS": "1", **env},
        cwd=model_dir,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
