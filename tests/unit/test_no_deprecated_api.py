"""A training's default path uses no API that torch deprecates: on torch >= 2.10 the model folder holds
best.pt2 (torch.export) and an ONNX file from torch's torch.export-based exporter, not TorchScript (torch.jit
warns "is deprecated. Please switch to torch.compile or torch.export" there); TorchScript only on request."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from tiny_training import tiny_training

from yolov5_smddp import serving

REPO = Path(__file__).resolve().parents[2]

# every warning a training raises, as a list of {category, message, file}: printed by the child
_TRAIN = """
import json, sys, warnings
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    from yolov5_smddp.commands.train import main
    code = main(sys.argv[1:])
print(json.dumps({"code": code, "warnings": [
    {"category": w.category.__name__, "message": str(w.message), "file": w.filename} for w in caught]}))
"""


def _deprecations(found: list[dict]) -> list[dict]:
    """The warnings that say an API is deprecated (FutureWarning / DeprecationWarning naming torch, or raised
    from torch's code)."""
    return [
        w
        for w in found
        if w["category"] in ("FutureWarning", "DeprecationWarning")
        and ("torch" in w["message"] or f"{os.sep}torch{os.sep}" in w["file"])
    ]


def test_a_training_prints_no_deprecation_warning_and_writes_the_current_formats(tmp_path):
    from yolov5_smddp.data.synthetic import make_default_dataset

    data = make_default_dataset(tmp_path / "data", n_train=4, n_val=2, imgsz=64, seed=1)
    out = tmp_path / "run"
    argv = tiny_training(out, data, "--epochs", "1", "--noplots", batch_size=2)
    env = {k: v for k, v in os.environ.items() if k != serving.TORCHSCRIPT_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-c", _TRAIN, *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["code"] == 0
    assert _deprecations(result["warnings"]) == []
    assert "is deprecated" not in proc.stderr
    written = sorted(p.name for p in (out / "model").iterdir() if p.name.startswith("best."))
    model_file = "best.pt2" if serving.serving_formats()[0] == "pt2" else "best.torchscript"
    assert model_file in written and ("best.torchscript" in written) == (model_file == "best.torchscript")


def test_the_model_folder_formats_follow_the_torch_release_and_the_request():
    env_on = {serving.TORCHSCRIPT_ENV: "1"}
    assert serving.serving_formats("2.5.1", {})[0] == "torchscript"
    assert serving.serving_formats("2.10.0", {})[0] == "pt2" and "torchscript" not in serving.serving_formats(
        "2.10.0", {}
    )
    assert serving.serving_formats("2.15.0+cu132", env_on)[:2] == ("pt2", "torchscript")
    assert serving.serving_formats("2.6.0", env_on)[0] == "torchscript"


def test_best_pt2_serves_what_the_model_computes(tmp_path):
    """The handler loads best.pt2 (no TorchScript) and its forward equals the exported module's."""
    if serving.serving_formats()[0] != "pt2":
        return  # torch < 2.10: best.torchscript, tested in test_serving
    from yolov5_smddp.models.yolo import build_model
    from yolov5_smddp.serving import inference

    model = build_model("yolov5n", nc=3).eval()
    serving.write_model_folder(tmp_path, model, 64)
    assert (tmp_path / "best.pt2").is_file() and not (tmp_path / "best.torchscript").exists()
    loaded = inference.model_fn(str(tmp_path))
    assert loaded["torchscript"] is False and loaded["imgsz"] == (64, 64)
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        expected = model.fuse().eval()(x)[0]
    got = inference.forward(loaded, x)
    assert torch.allclose(got, expected, atol=1e-4, rtol=1e-4)
