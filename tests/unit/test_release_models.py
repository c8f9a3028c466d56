"""The release's model yamls and checkpoints, against numbers the release's own code produced
(tests/fixtures/release_models, made by bench/release_reference/make_model_fixtures.py in a throwaway
image with the PyPI `yolov5` 7.0.14; see that folder's README):

- every v7.0 detection yaml (models/ and models/hub/) builds with the release's parameter count at nc 80
  and strides, `info --cfg` prints that count, and with fixed weights it computes the release's outputs;
- every checkpoint the release pickled (stock yolov5n and yolov5n6; ghost, transformer, LeakyReLU,
  yolov3-tiny, P2 and the v5.0 / v3.0 layouts at small widths) is rebuilt exactly as stored: the same
  parameters and outputs through load, export and predict, and fine-tuning keeps its architecture."""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import cv2
import pytest
import torch
import yaml
from fixed_weights import fill_fixed, fixed_input

from yolov5_smddp.cli import main
from yolov5_smddp.detection.postprocess import non_max_suppression
from yolov5_smddp.errors import WeightsError
from yolov5_smddp.models.initial import initial_model
from yolov5_smddp.models.weights import config_for_release, load_model, load_weights
from yolov5_smddp.models.yolo import build_model

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "release_models"
REFERENCE = json.loads((FIXTURES / "yaml_reference.json").read_text())
CHECKPOINTS = torch.load(FIXTURES / "checkpoint_outputs.pt", weights_only=True)
TOLERANCE = 1e-4  # boxes: max |ours - release| / max |release box|; scores (0..1): max |ours - release|


def relative_error(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return float((torch.as_tensor(ours).float() - ref).abs().max() / ref.abs().max())


def output_error(ours: torch.Tensor, ref: torch.Tensor) -> float:
    """Rows of (xywh pixels, objectness, class scores): the boxes' error relative to the largest box value,
    the scores' absolute error (a relative error over all columns would let the pixel-sized box values
    hide score errors)."""
    diff = (torch.as_tensor(ours).float() - ref).abs()
    return max(float(diff[:, :4].max() / ref[:, :4].abs().max()), float(diff[:, 4:].max()))


def _params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_the_fixtures_cover_every_v7_detection_yaml():
    assert len(REFERENCE) == 23
    assert {"yolov5n6.yaml", "yolov5-p7.yaml", "yolov3-tiny.yaml", "yolov5s-ghost.yaml"} <= set(REFERENCE)


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_release_yaml_has_the_release_parameter_count_and_strides(name):
    ref = REFERENCE[name]
    with torch.device("meta"):
        model = build_model({**ref["config"], "name": name})
    assert _params(model) == ref["params"]
    assert list(model.detect.strides) == ref["stride"]


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_release_yaml_computes_the_release_outputs(name):
    ref, expected = REFERENCE[name], torch.load(FIXTURES / "yaml_outputs.pt", weights_only=True)[name]
    model = build_model({**ref["config"], **ref["outputs_at"], "name": name})
    assert _params(model) == ref["small_params"]
    with torch.no_grad():
        pred = fill_fixed(model).eval()(fixed_input())[0][0]
        other = model(fixed_input().flip(-1))[0][0]
    assert pred.shape[0] == expected["head"].shape[0]
    assert output_error(pred[:, :8], expected["head"]) < TOLERANCE
    assert output_error(other[:, :8], expected["head"]) > 10 * TOLERANCE  # the comparison can tell
    assert relative_error(pred[:, 5:].sum(-1), expected["class_sum"]) < TOLERANCE


@pytest.mark.parametrize(
    "name", ["yolov5s6.yaml", "yolov5-p7.yaml", "yolov5s-LeakyReLU.yaml", "yolov3-tiny.yaml"]
)
def test_info_prints_the_release_parameter_count_for_its_yaml(tmp_path, capsys, name):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(REFERENCE[name]["config"], sort_keys=False))
    imgsz = "128" if name == "yolov5-p7.yaml" else "640"
    assert main(["info", "--cfg", str(path), "--imgsz", imgsz]) == 0
    assert f" {REFERENCE[name]['params']:,} parameters" in capsys.readouterr().out


@pytest.mark.parametrize("size", ["n6", "s6", "m6", "l6", "x6"])
def test_packaged_p6_names_are_the_release_p6_models(size):
    with torch.device("meta"):
        model = build_model(f"yolov5{size}")
    assert _params(model) == REFERENCE[f"yolov5{size}.yaml"]["params"]
    assert list(model.detect.strides) == [8.0, 16.0, 32.0, 64.0]


# --- checkpoints pickled by the release ------------------------------------------------------------


def _release_pred(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(fixed_input(64, 64))[0][0]


@pytest.mark.parametrize("name", sorted(CHECKPOINTS))
def test_release_checkpoint_is_rebuilt_as_stored(name):
    ref = CHECKPOINTS[name]
    model = load_model(FIXTURES / name)
    assert _params(model) == ref["params"]
    assert list(model.detect.strides) == ref["stride"]
    assert output_error(_release_pred(model), ref["pred"]) < TOLERANCE
    assert model.names[7] == "class7"
    # the comparison can tell: another input gives outputs far outside the tolerance
    with torch.no_grad():
        other = model(fixed_input(64, 64).flip(-1))[0][0]
    assert output_error(other, ref["pred"]) > 10 * TOLERANCE


def test_older_layouts_keep_their_activations():
    """A v3.0-style checkpoint: Hardswish convolutions and LeakyReLU(0.1) inside BottleneckCSP, none of it
    in its yaml; v5.0-style: Focus and SPP with SiLU."""
    cfg = load_weights(FIXTURES / "v3.0-layout_w0125.pt").cfg
    assert cfg["activation"] == "nn.Hardswish()"
    assert set(cfg["activations"]) == {f"model.{i}.act" for i in (2, 4, 6, 9, 13, 17, 20, 23)}
    assert set(cfg["activations"].values()) == {"nn.LeakyReLU(0.1)"}
    model = load_model(FIXTURES / "v3.0-layout_w0125.pt")
    assert type(model.model[0]).__name__ == "Focus" and type(model.model[8]).__name__ == "SPP"
    assert isinstance(model.model[0].conv.act, torch.nn.Hardswish)
    assert isinstance(model.model[2].act, torch.nn.LeakyReLU) and model.model[2].act.negative_slope == 0.1
    v5 = load_weights(FIXTURES / "v5.0-layout_w0125.pt")
    assert "activation" not in v5.cfg and "activations" not in v5.cfg
    assert not any(k.endswith("anchor_grid") for k in v5.state_dict)  # the old Detect's derived buffer


def test_the_stored_yaml_is_read_as_the_release_wrote_it():
    cfg = load_weights(FIXTURES / "yolov5s-LeakyReLU_w0125.pt").cfg
    assert cfg["head"][1] == [-1, 1, "nn.Upsample", ["None", 2, "nearest"]]  # the string 'None'
    assert cfg["activation"] == "nn.LeakyReLU(0.1)" and cfg["width_multiple"] == 0.125
    model = load_model(FIXTURES / "yolov5s-LeakyReLU_w0125.pt")
    acts = {type(m.act) for m in model.modules() if type(m).__name__ == "Conv"}
    assert acts == {torch.nn.LeakyReLU}


def test_a_checkpoint_whose_pickled_modules_differ_from_its_yaml_stops(tmp_path):
    """No silent substitute: a yaml that builds another architecture than the pickled one is an error
    naming the module and class."""
    release = __import__("yolov5_smddp.models.release_pickle", fromlist=["x"]).read_release_checkpoint(
        FIXTURES / "yolov5s-ghost_w0125.pt"
    )
    wrong = dict(release.yaml)
    wrong["backbone"] = [[f, n, "C3" if m == "C3Ghost" else m, a] for f, n, m, a in wrong["backbone"]]
    with pytest.raises(WeightsError, match=r"model\.2 is a (yolov5\.)?models\.common\.C3Ghost"):
        config_for_release(
            type(release)(release.state_dict, wrong, release.names, release.stride, release.modules)
        )


def test_a_checkpoint_with_a_class_we_do_not_build_names_it(tmp_path):
    path = tmp_path / "c3x.pt"
    with zipfile.ZipFile(FIXTURES / "yolov5n.pt") as source, zipfile.ZipFile(path, "w") as target:
        for info in source.infolist():
            data = source.read(info)
            if info.filename.endswith("data.pkl"):  # the pickle now names models.common.C3x
                patched = data.replace(b"models.common\nC3\n", b"models.common\nC3x\n")
                assert patched != data
                data = patched
            target.writestr(info, data)
    with pytest.raises(WeightsError, match=r"c3x.pt: cannot rebuild its architecture: .*models\.common\.C3x"):
        load_weights(path)


@pytest.mark.parametrize("name", sorted(CHECKPOINTS))
def test_export_of_a_release_checkpoint_computes_its_outputs(tmp_path, name):
    ort = pytest.importorskip("onnxruntime")
    weights = tmp_path / name
    shutil.copy(FIXTURES / name, weights)
    out = tmp_path / "exported"
    argv = ["export", "--weights", str(weights), "--include", "onnx", "torchscript", "--imgsz", "64"]
    assert main([*argv, "--output-dir", str(out)]) == 0
    stem, ref, x = weights.stem, CHECKPOINTS[name]["pred"], fixed_input(64, 64)
    session = ort.InferenceSession(str(out / f"{stem}.onnx"), providers=["CPUExecutionProvider"])
    assert output_error(torch.from_numpy(session.run(None, {"images": x.numpy()})[0][0]), ref) < TOLERANCE
    with torch.no_grad():
        assert output_error(torch.jit.load(str(out / f"{stem}.torchscript"))(x)[0], ref) < TOLERANCE


@pytest.mark.parametrize("name", ["yolov5n6.pt", "yolov5s-transformer_w0125.pt", "v3.0-layout_w0125.pt"])
def test_predict_on_a_release_checkpoint_gives_the_release_detections(tmp_path, name):
    image = (fixed_input(64, 64)[0].permute(1, 2, 0) * 255).round().to(torch.uint8).numpy()
    source = tmp_path / "image.png"
    cv2.imwrite(str(source), cv2.cvtColor(image, cv2.COLOR_RGB2BGR))
    out = tmp_path / "out"
    argv = ["predict", "--weights", str(FIXTURES / name), "--source", str(source), "--out", str(out)]
    # IoU threshold 1: NMS keeps every box over conf, so near-equal overlaps (these weights are not
    # trained) cannot make the comparison depend on the last bits of a score
    assert main([*argv, "--imgsz", "64", "--conf", "0.2", "--iou", "1.0"]) == 0
    got = json.loads((out / "image.json").read_text())["detections"]
    (expected,) = non_max_suppression(CHECKPOINTS[name]["pred"][None], 0.2, 1.0, max_det=300)
    expected[:, :4] = expected[:, :4].clamp(0, 64)  # predict clips boxes to the image
    assert len(got) == len(expected) > 0
    unmatched = expected.tolist()
    for record in got:
        match = next(
            row
            for row in unmatched
            if record["class_id"] == int(row[5])
            and abs(record["score"] - row[4]) < 1e-4
            and max(abs(a - b) for a, b in zip(record["box_xyxy"], row[:4])) < 0.02
        )
        unmatched.remove(match)


@pytest.mark.parametrize("name", sorted(CHECKPOINTS))
def test_fine_tuning_a_release_checkpoint_keeps_its_architecture(name):
    stored = load_weights(FIXTURES / name).cfg
    built = initial_model(None, str(FIXTURES / name), 3, ["a", "b", "c"])
    cfg = built.model.cfg
    for key in ("backbone", "head", "depth_multiple", "width_multiple", "activation", "activations"):
        assert cfg.get(key) == stored.get(key), key
    assert built.model.nc == 3 and built.transfer.param_fraction > 0.9
    assert built.transfer.skipped_shape == [] and built.transfer.missing == []
    reference = load_model(FIXTURES / name)
    assert [type(m).__name__ for m in built.model.modules()] == [
        type(m).__name__ for m in reference.modules()
    ]


@pytest.mark.parametrize(
    ("name", "balance"),
    [("yolov5n6.yaml", (4.0, 1.0, 0.25, 0.06)), ("yolov3-tiny.yaml", (4.0, 1.0)), ("yolov5-p7.yaml", None)],
)
def test_models_with_other_than_three_levels_train(name, balance):
    """The loss's objectness balance per level for 2, 4 and 5 levels (the release's 4, 1, 0.25, 0.06, 0.02)."""
    from yolov5_smddp.detection.loss import LossHyp, YoloLoss

    ref = REFERENCE[name]
    model = build_model({**ref["config"], **ref["outputs_at"], "name": name}, nc=2).train()
    loss_fn = YoloLoss(model, LossHyp.from_mapping({"box": 0.05, "obj": 1.0, "cls": 0.5, "anchor_t": 4.0}))
    assert loss_fn.balance == (balance or (4.0, 1.0, 0.25, 0.06, 0.02))
    loss, items = loss_fn(model(fixed_input().repeat(2, 1, 1, 1)), torch.tensor([[0, 1, 0.5, 0.5, 0.4, 0.3]]))
    loss.backward()
    assert torch.isfinite(items).all() and items[1] > 0  # objectness (p7 has placeholder anchors)
    assert all(torch.isfinite(conv.weight.grad).all() for conv in model.detect.m)
