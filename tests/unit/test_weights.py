"""Checkpoint I/O: our format, transfer learning, and the release's pickled models read safely."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from torch import nn

from yolov5_smddp.errors import WeightsError
from yolov5_smddp.models.weights import FORMAT, load_model, load_weights, save_weights, transfer_state
from yolov5_smddp.models.yolo import build_model


@pytest.fixture(scope="module")
def model_n():
    torch.manual_seed(0)
    return build_model("yolov5n").eval()


def _outputs(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(x)[0]


def test_own_format_round_trip(tmp_path, model_n):
    model_n.names = [f"thing{i}" for i in range(80)]
    path = save_weights(tmp_path / "sub" / "w.pt", model_n, meta={"epoch": 3, "note": ("a", 1)})
    raw = torch.load(path, weights_only=True)
    assert raw["format"] == FORMAT and raw["meta"]["note"] == ["a", 1]
    assert [p.name for p in path.parent.iterdir()] == ["w.pt"]  # no temp file left behind
    loaded = load_weights(path)
    assert loaded.source == "yolov5-smddp" and loaded.nc == 80 and loaded.names[3] == "thing3"
    assert loaded.meta["epoch"] == 3 and loaded.meta["stride"] == [8.0, 16.0, 32.0]
    assert loaded.meta["precision"] == "float32"
    model = load_model(path)
    assert model.names[3] == "thing3" and not model.training
    x = torch.rand(1, 3, 64, 64)
    assert torch.equal(_outputs(model, x), _outputs(model_n, x))
    model_n.names = [f"class{i}" for i in range(80)]


def test_half_weights_and_failed_write_leaves_old_file(tmp_path, model_n):
    path = save_weights(tmp_path / "w.pt", model_n, meta={}, half=True)
    loaded = load_weights(path)
    assert loaded.state_dict["model.0.conv.weight"].dtype == torch.float16
    assert load_model(path).model[0].conv.weight.dtype == torch.float32
    before = path.read_bytes()
    with pytest.raises(ValueError, match="JSON-able"):
        save_weights(path, model_n, meta={"bad": object()})
    assert path.read_bytes() == before and len(list(tmp_path.iterdir())) == 1


def test_transfer_coco_weights_into_three_classes(tmp_path, model_n):
    target = build_model("yolov5n", nc=3)
    report = transfer_state(target, model_n.state_dict())
    assert report.loaded == 349 - 6
    assert sorted(report.skipped_shape) == sorted(
        f"model.24.m.{i}.{p}" for i in range(3) for p in ("weight", "bias")
    )
    assert report.missing == [] and report.unexpected == []
    assert torch.equal(target.model[4].cv1.conv.weight, model_n.model[4].cv1.conv.weight)
    assert "343" in report.summary()
    report = transfer_state(
        target, {"model.24.anchors": torch.ones(3, 3, 2), "extra": torch.ones(1)}, exclude=("anchors",)
    )
    assert report.loaded == 0 and report.excluded == ["model.24.anchors"] and report.unexpected == ["extra"]
    assert not torch.equal(target.detect.anchors, torch.ones(3, 3, 2))


def test_bare_state_dict_and_errors(tmp_path, model_n):
    path = tmp_path / "sd.pt"
    torch.save(model_n.state_dict(), path)
    loaded = load_weights(path)
    assert loaded.source == "state_dict" and loaded.cfg is None and len(loaded.state_dict) == 349
    with pytest.raises(WeightsError, match="only a state dict"):
        load_model(path)
    with pytest.raises(WeightsError, match="does not exist"):
        load_weights(tmp_path / "missing.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(WeightsError, match="junk.pt: not a PyTorch checkpoint"):
        load_weights(tmp_path / "junk.pt")


def test_incompatible_checkpoint_is_refused(tmp_path, model_n):
    path = save_weights(tmp_path / "w.pt", model_n, meta={})
    ckpt = torch.load(path, weights_only=True)
    ckpt["meta"]["cfg"]["width_multiple"] = 0.5
    torch.save(ckpt, path)
    with pytest.raises(WeightsError, match="w.pt: incompatible"):
        load_model(path)


# --- the release's format -------------------------------------------------------------------------


RELEASE_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "release_models"


@pytest.mark.parametrize(("name", "unfinished"), [("yolov5n.pt", False), ("yolov5s-ghost_w0125.pt", True)])
def test_release_checkpoint_loads_through_the_allow_list(name, unfinished):
    """Checkpoints the release's own code pickled: a finished run's (only `model`, after its
    strip_optimizer) and an unfinished one's (`model` and `ema`, the optimizer state, opt)."""
    path = RELEASE_FIXTURES / name
    with pytest.raises(Exception, match="(?i)weights only load failed|unsupported global"):
        torch.load(path, weights_only=True)
    loaded = load_weights(path)
    assert loaded.source == "release" and loaded.nc == 80 and loaded.names[5] == "class5"
    assert loaded.state_dict["model.2.cv1.conv.weight"].dtype == torch.float16
    assert loaded.cfg["head"][1][3] == ["None", 2, "nearest"]  # as the release's yaml.safe_load left it
    model = load_model(path)
    assert list(model.state_dict()) == list(loaded.state_dict)
    if not unfinished:
        assert loaded.cfg["width_multiple"] == 0.25 and loaded.cfg["anchors"][0] == [10, 13, 16, 30, 33, 23]
        assert sum(p.numel() for p in model.parameters()) == 1_872_157  # the release's count


class _RunsShell:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class _Evaluates:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (eval, (f"open({str(self.marker)!r}, 'w').write('x')",))


@pytest.mark.parametrize("payload", [_RunsShell, _Evaluates])
def test_malicious_pickle_is_refused_without_side_effects(tmp_path, payload):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    torch.save({"epoch": 0, "model": payload(marker), "ema": None}, path)
    with pytest.raises(
        WeightsError, match=r"evil.pt: refuses to load: the pickle names (posix\.system|builtins\.eval)"
    ):
        load_weights(path)
    assert not marker.exists()


# --- checkpoints of our first config layout (`layers`, up to 0.1.0-1b6775095) -------------------------------
SMDDP_V1 = Path(__file__).resolve().parents[1] / "fixtures" / "smddp_v1"


def test_a_checkpoint_of_our_first_layout_loads_as_the_same_model(tmp_path):
    """best.pt written by 1b67750's own code (config in `layers` rows) rebuilds as the same model: every
    tensor of its state dict in place, the outputs it computed then, and a re-save in today's layout."""
    path = SMDDP_V1 / "smddp-v1-layers_w0125.pt"
    stored = torch.load(path, weights_only=True)
    assert "layers" in stored["meta"]["cfg"]  # the fixture is the old layout
    model = load_model(path)
    assert set(model.state_dict()) == set(stored["state_dict"])
    assert model.names == ["rectangle", "ellipse", "triangle"] and model.nc == 3
    reference = torch.load(SMDDP_V1 / "smddp-v1-layers_w0125_output.pt", weights_only=True)
    x = torch.linspace(0, 1, 3 * 64 * 64).reshape(reference["input_shape"])
    with torch.no_grad():
        out = model(x)
    out = out[0] if isinstance(out, (tuple, list)) else out
    ref = reference["output"]
    assert out.shape == ref.shape
    assert ((out - ref).abs().max() / ref.abs().max()).item() < 1e-5
    again = save_weights(tmp_path / "again.pt", model, meta={})
    cfg = load_weights(again).cfg
    assert "layers" not in cfg and cfg["backbone"][-1][2] == "SPPF" and cfg["head"][-1][2] == "Detect"
