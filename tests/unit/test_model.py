"""The model family: state-dict compatibility with the release, the fixture's outputs, the builder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from yolov5_smddp.errors import ConfigError
from yolov5_smddp.models.yolo import (
    activation_text,
    build_model,
    load_model_config,
    parse_activation,
    resolve_layers,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture(scope="module")
def reference() -> dict:
    return torch.load(FIXTURES / "yolov5n_nc80_reference.pt", weights_only=True)


@pytest.fixture(scope="module")
def reference_model(reference):
    model = build_model("yolov5n")
    model.load_state_dict(
        {k: v.float() if v.is_floating_point() else v for k, v in reference["state_dict"].items()}
    )
    return model


def _rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return ((ours - ref).abs().max() / ref.abs().max()).item()


@pytest.mark.parametrize("size", ["n", "s", "m", "l", "x"])
def test_state_dict_matches_release_manifest(size):
    manifest = json.loads((FIXTURES / "state_dict_manifest.json").read_text())[f"yolov5{size}"]
    with torch.device("meta"):
        model = build_model(f"yolov5{size}.yaml")
    shapes = {k: list(v.shape) for k, v in model.state_dict().items()}
    assert list(shapes) == list(manifest["state_dict"])
    assert shapes == manifest["state_dict"]
    assert sum(p.numel() for p in model.parameters()) == manifest["params"]


def test_eval_output_matches_reference(reference, reference_model):
    reference_model.eval()
    with torch.no_grad():
        pred, raw = reference_model(reference["input"])
    assert pred.shape == reference["eval_pred"].shape == (1, 2205, 85)
    assert _rel_err(pred, reference["eval_pred"]) < 1e-4
    assert [r.shape[2:4] for r in raw] == [(20, 28), (10, 14), (5, 7)]


def test_train_output_matches_reference(reference, reference_model):
    reference_model.train()
    # training-mode BatchNorm updates running statistics: work on a copy
    model = build_model("yolov5n")
    model.load_state_dict(reference_model.state_dict())
    model.train()
    with torch.no_grad():
        raw = model(reference["input"])
    assert len(raw) == 3
    for ours, ref in zip(raw, reference["train_raw"]):
        assert ours.shape == ref.shape
        assert _rel_err(ours, ref) < 1e-4


def test_fused_model_computes_the_same(reference, reference_model):
    model = build_model("yolov5n")
    model.load_state_dict(reference_model.state_dict())
    model.eval()
    with torch.no_grad():
        fused_pred, _ = model.fuse()(reference["input"])
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
    assert _rel_err(fused_pred, reference["eval_pred"]) < 1e-4


def test_model_contract_attributes_and_overrides():
    anchors = [[8, 8, 16, 16, 24, 24], [32, 32, 48, 48, 64, 64], [96, 96, 128, 128, 256, 256]]
    model = build_model("yolov5n", nc=3, anchors=anchors)
    assert model.stride.tolist() == [8.0, 16.0, 32.0]
    assert model.nc == 3 and model.cfg["nc"] == 3
    assert model.names == ["class0", "class1", "class2"]
    assert model.detect is model.model[-1]
    assert torch.allclose(model.detect.anchors[2], torch.tensor([[3.0, 3.0], [4.0, 4.0], [8.0, 8.0]]))
    model.train()
    raw = model(torch.rand(2, 3, 64, 96))
    assert [tuple(r.shape) for r in raw] == [(2, 3, 8, 12, 8), (2, 3, 4, 6, 8), (2, 3, 2, 3, 8)]
    model.eval()
    with torch.no_grad():
        pred, _ = model(torch.rand(1, 3, 64, 96))
    assert pred.shape == (1, 3 * (96 + 24 + 6), 8)
    assert ((pred[..., 4:] >= 0) & (pred[..., 4:] <= 1)).all()
    with torch.no_grad():  # a validation batch whose every image was left out (undecodable)
        empty, _ = model(torch.rand(0, 3, 64, 96))
    assert empty.shape == (0, 3 * (96 + 24 + 6), 8) and empty.dtype == torch.float32


def test_detect_bias_prior_for_training_from_scratch():
    torch.manual_seed(0)
    model = build_model("yolov5n", nc=3)
    bias = model.detect.m[0].bias.view(3, 8)
    # default conv bias init is within ±1/sqrt(fan_in) = ±0.125 for 64 input channels
    assert torch.allclose(bias[:, 4], torch.full((3,), torch.log(torch.tensor(8 / 80**2)).item()), atol=0.13)
    assert torch.allclose(
        bias[:, 5:], torch.full((3, 3), torch.log(torch.tensor(0.6 / 2.00001)).item()), atol=0.13
    )


def test_layer_table_of_yolov5s():
    layers = resolve_layers(load_model_config("yolov5s"))
    assert len(layers) == 25
    assert layers[0].args == (3, 32, 6, 2, 2) and layers[0].stride == 2
    assert layers[6].block == "C3" and layers[6].repeats == 3 and layers[6].args == (256, 256, 3)
    assert layers[11].block == "nn.Upsample" and layers[11].args == (None, 2, "nearest")
    assert layers[12].sources == (11, 6) and layers[12].out_channels == 512
    assert layers[13].args == (512, 256, 1, False)
    assert layers[24].sources == (17, 20, 23)
    assert [layers[i].stride for i in (17, 20, 23)] == [8, 16, 32]


def test_unknown_block_is_refused_not_evaluated():
    cfg = load_model_config("yolov5n")
    cfg["backbone"][3][2] = "__import__('os').system('true')"
    with pytest.raises(ConfigError, match="layer 3 .*unknown module"):
        build_model(cfg)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda c: c.update(nc=0), "nc must be a positive integer"),
        (lambda c: c.update(anchors=[[10, 13, 16]]), "anchors must be"),
        (lambda c: c.update(anchors=-3), "anchors must be"),
        (lambda c: c["backbone"][1].__setitem__(3, [128, "3", 2]), "layer 1 \\(Conv\\).*k='3' must be"),
        (lambda c: c["head"][2].__setitem__(0, [-1, 30]), "layer 12 \\(Concat\\).*must name earlier layers"),
        (lambda c: c["head"][0].__setitem__(3, [512, 1, 1, 0, 1, 1, True, 9]), "layer 10 .*at most 6"),
        (lambda c: c["head"][1].__setitem__(3, [None, 2, "linear"]), "layer 11 .*mode='linear' must be"),
        (lambda c: c["head"][-1].__setitem__(0, [17, 20]), "layer 24 \\(Detect\\).*: 3 anchor rows for 2"),
        (lambda c: c.pop("backbone"), "missing keys \\['backbone'\\]"),
        (lambda c: c.update(layers=[]), "missing keys \\['backbone', 'head'\\] \\(this is the old"),
        (lambda c: c.update(activation="__import__('os').system('true')"), "activation: .* is not one of"),
        (lambda c: c.update(activation="nn.ReLU(os.getcwd())"), "activation: .*bad arguments"),
        (lambda c: c.update(activation="nn.LeakyReLU(0.1, 2, 3)"), "activation: .*bad arguments"),
    ],
)
def test_bad_configs_name_the_problem(edit, message):
    cfg = load_model_config("yolov5n")
    edit(cfg)
    if "layers" in cfg:
        cfg.pop("backbone"), cfg.pop("head")
    with pytest.raises(ConfigError, match=message):
        build_model(cfg)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("nn.LeakyReLU(0.1)", torch.nn.LeakyReLU(0.1)),
        ("nn.ReLU()", torch.nn.ReLU()),
        (" nn.Hardswish() ", torch.nn.Hardswish()),
        ("nn.SiLU(inplace=True)", torch.nn.SiLU()),
    ],
)
def test_activation_is_read_from_an_allow_list(text, expected):
    made = parse_activation(text)()
    assert type(made) is type(expected) and activation_text(made) == activation_text(expected)
    cfg = load_model_config("yolov5n")
    cfg["activation"] = text
    model = build_model(cfg)
    convs = [m for m in model.modules() if type(m).__name__ == "Conv"]
    assert convs and all(type(m.act) is type(expected) for m in convs)
    if isinstance(expected, torch.nn.LeakyReLU):
        assert {m.act.negative_slope for m in convs} == {0.1}


def test_width_rounds_channels_up_to_multiples_of_8_and_depth_rounds_repeats():
    cfg = load_model_config("yolov5n")
    cfg.update(width_multiple=0.3, depth_multiple=0.5)
    layers = resolve_layers(cfg)
    assert layers[0].out_channels == 24  # ceil(64 * 0.3 / 8) * 8, not 16
    assert layers[4].repeats == 3 and layers[2].repeats == 2  # max(round(6 * 0.5), 1); round(1.5) = 2


def test_p6_names_and_release_format_rows():
    model = build_model("yolov5n6")
    assert model.stride.tolist() == [8.0, 16.0, 32.0, 64.0] and len(model.model) == 34
    model.eval()
    with torch.no_grad():
        pred, raw = model(torch.rand(1, 3, 128, 192))
    assert [r.shape[2:4] for r in raw] == [(16, 24), (8, 12), (4, 6), (2, 3)]
    assert pred.shape == (1, 3 * (16 * 24 + 8 * 12 + 4 * 6 + 2 * 3), 85)


def test_config_lookup(tmp_path):
    with pytest.raises(ConfigError, match="yolov5q"):
        load_model_config("yolov5q")
    path = tmp_path / "custom.yaml"
    path.write_text(
        (Path(__file__).resolve().parents[2] / "yolov5_smddp/models/cfg/yolov5n.yaml").read_text()
    )
    assert load_model_config(path)["width_multiple"] == 0.25
    path.write_text("nc: [unclosed")
    with pytest.raises(ConfigError, match="custom.yaml: not valid YAML"):
        load_model_config(path)
