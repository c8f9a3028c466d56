"""initial_model: the checkpoint defines the model without --cfg (ours and the release's), the transfer
report counts real tensors and parameter elements, a --cfg that does not fit the checkpoint stops."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from release_checkpoint import release_yaml, save_release_checkpoint

from yolov5_smddp.errors import ConfigError, WeightsError
from yolov5_smddp.models.initial import architecture_name, initial_model
from yolov5_smddp.models.weights import load_weights, save_weights, transfer_state
from yolov5_smddp.models.yolo import build_model, load_model_config

FITTED = [[5.0, 40.0, 8.0, 60.0, 11.0, 90.0], [20, 150, 30, 210, 40, 260], [60, 380, 90, 500, 120, 600]]
NAMES3 = ["a", "b", "c"]


@pytest.fixture(scope="module")
def trained_n(tmp_path_factory):
    """A yolov5n (nc 80) with non-default weights and anchors fitted to some dataset, saved in our format."""
    torch.manual_seed(1)
    model = build_model("yolov5n", anchors=FITTED)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    path = save_weights(tmp_path_factory.mktemp("w") / "best.pt", model, meta={})
    return model, path


def _params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def test_no_cfg_builds_the_checkpoint_architecture_with_new_class_rows(trained_n):
    source, path = trained_n
    built = initial_model(None, str(path), 3, NAMES3)
    model, report = built.model, built.transfer
    assert (
        built.architecture == "yolov5n" and built.from_checkpoint and built.anchors_from == "the checkpoint"
    )
    assert model.nc == 3 and model.names == NAMES3
    assert _params(model) == _params(build_model("yolov5n", nc=3))
    # anchors fitted to the earlier dataset survive
    torch.testing.assert_close(model.detect.anchors, source.detect.anchors)
    assert model.cfg["anchors"] == FITTED
    # 349 keys: 57 num_batches_tracked are never counted; the 6 Detect conv tensors are partial
    assert (report.tensors, report.total_tensors) == (286, 292)
    assert sorted(report.partial) == sorted(
        f"model.24.m.{i}.{p}" for i in range(3) for p in ("weight", "bias")
    )
    assert report.skipped_shape == [] and report.missing == [] and report.unexpected == []
    assert report.param_fraction > 0.99
    new, old = model.detect.m[0].weight.view(3, 8, -1), source.detect.m[0].weight.view(3, 85, -1)
    torch.testing.assert_close(new[:, :5], old[:, :5])  # box + objectness rows kept
    assert not torch.equal(new[:, 5:], old[:, 5:8])  # class rows re-made
    assert built.line.startswith(
        f"model: yolov5n from weights {path} (nc 80→3, anchors from the checkpoint); "
    )
    assert "transferred 286/292 tensors (" in built.line and "% of parameters)" in built.line


def test_same_classes_transfer_everything(trained_n):
    source, path = trained_n
    built = initial_model(None, str(path), 80, [str(i) for i in range(80)])
    assert (built.transfer.tensors, built.transfer.total_tensors) == (292, 292)
    assert built.transfer.param_fraction == 1.0 and "(100.0% of parameters)" in built.line
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(built.model.eval()(x)[0], source.eval()(x)[0])


def test_explicit_cfg_takes_its_anchors_and_counts_only_real_tensors(trained_n):
    _, path = trained_n
    built = initial_model("yolov5n", str(path), 3, NAMES3)
    assert built.anchors_from == "yolov5n.yaml" and not built.from_checkpoint
    assert built.model.cfg["anchors"] == load_model_config("yolov5n")["anchors"]
    assert (built.transfer.tensors, built.transfer.total_tensors) == (285, 292)  # anchors excluded
    assert built.line.startswith("model: yolov5n from --cfg yolov5n (anchors from yolov5n.yaml), weights ")


def test_a_cfg_that_does_not_fit_stops_unless_allowed(trained_n):
    _, path = trained_n
    with pytest.raises(ConfigError) as caught:
        initial_model("yolov5s", str(path), 3, NAMES3)
    message = str(caught.value)
    assert "--cfg yolov5s does not fit --weights" in message and "the checkpoint is yolov5n" in message
    assert "--allow-partial-transfer" in message and "0.0% of its parameters" in message
    built = initial_model("yolov5s", str(path), 3, NAMES3, allow_partial=True)
    assert built.architecture == "yolov5s" and built.transfer.tensors == 0
    assert "transferred 0/" in built.line


def test_batchnorm_counters_alone_never_count_as_a_transfer():
    model = build_model("yolov5n", nc=3)
    counters = {
        k: v for k, v in build_model("yolov5s").state_dict().items() if k.endswith("num_batches_tracked")
    }
    report = transfer_state(model, counters)
    assert report.loaded == len(counters) > 50  # they do match by name and shape...
    assert report.tensors == 0 and report.copied_params == 0  # ...but are not a transfer


def test_bare_state_dict_needs_cfg(tmp_path):
    path = tmp_path / "sd.pt"
    torch.save(build_model("yolov5n").state_dict(), path)
    with pytest.raises(ConfigError, match="holds only a state dict.*give --cfg"):
        initial_model(None, str(path), 3, NAMES3)
    assert initial_model("yolov5n", str(path), 3, NAMES3).transfer.tensors == 285


def test_without_weights_and_when_resuming():
    built = initial_model(None, None, 2, ["x", "y"])
    assert built.architecture == "yolov5s" and built.transfer is None
    assert (
        built.line
        == "model: yolov5s from yolov5s.yaml (nc 2, anchors from yolov5s.yaml), trained from scratch (no --weights)"
    )
    cfg = build_model("yolov5n", nc=2, anchors=FITTED).cfg
    resumed = initial_model("yolov5s", "ignored.pt", 2, ["x", "y"], resume_cfg=cfg)
    assert resumed.architecture == "yolov5n" and resumed.model.cfg["anchors"] == FITTED


RELEASE_N = Path(__file__).resolve().parents[1] / "fixtures" / "release_models" / "yolov5n.pt"


def test_release_checkpoint_defines_the_model():
    """A yolov5n checkpoint the release's own code pickled."""
    loaded = load_weights(RELEASE_N)
    assert loaded.source == "release" and architecture_name(loaded.cfg) == "yolov5n"
    built = initial_model(None, str(RELEASE_N), 3, NAMES3)
    assert built.architecture == "yolov5n" and _params(built.model) == _params(build_model("yolov5n", nc=3))
    # the model's anchors buffer is what the release trains with, and what we keep
    torch.testing.assert_close(built.model.detect.anchors, loaded.state_dict["model.24.anchors"].float())
    assert (built.transfer.tensors, built.transfer.total_tensors) == (286, 292)
    assert (
        "model: yolov5n from weights" in built.line and "(nc 80→3, anchors from the checkpoint)" in built.line
    )


def test_a_release_checkpoint_without_its_layers_is_refused_not_substituted(tmp_path, trained_n):
    """No "packaged config with the same multiples" stand-in: without backbone/head the job stops."""
    source, _ = trained_n
    path = save_release_checkpoint(
        tmp_path / "yolov5n.pt",
        source,
        yaml=release_yaml(load_model_config("yolov5n"), with_layers=False),
        names=[f"n{i}" for i in range(80)],
    )
    with pytest.raises(WeightsError, match=r"yolov5n.pt: its model config cannot be built .*missing keys"):
        initial_model(None, str(path), 3, NAMES3)


def test_release_checkpoint_of_a_custom_layout_is_built_as_stored(tmp_path):
    config = load_model_config("yolov5n")
    config["backbone"][2][1] = 6  # not one of the packaged layouts
    source = build_model(config)
    path = save_release_checkpoint(
        tmp_path / "custom.pt", source, yaml=release_yaml(config), names=["x"] * 80
    )
    built = initial_model(None, str(path), 80, ["x"] * 80)
    assert _params(built.model) == _params(source) != _params(build_model("yolov5n"))
    assert built.transfer.param_fraction == 1.0


# --- the release-style options users reach for when fine-tuning ------------------------------------


def test_single_cls_makes_one_class_named_item(tmp_path):
    from easy_shapes import make_easy_dataset

    from yolov5_smddp.config.train_config import parse_train_args
    from yolov5_smddp.train.data_wiring import scan_data

    data = make_easy_dataset(tmp_path / "d", n_train=12, n_val=4, seed=0)
    plain = scan_data(parse_train_args(["--data", str(data)]), tmp_path / "cache")
    assert plain.nc == 3 and {int(c) for lab in plain.train_index.labels for c in lab[:, 0]} == {0, 1, 2}
    single = scan_data(parse_train_args(["--data", str(data), "--single-cls"]), tmp_path / "cache")
    assert single.nc == 1 and single.names == ["item"]
    for split in (single.train_index, single.val_index):
        assert all((lab[:, 0] == 0).all() for lab in split.labels)
    boxes = [lab[:, 1:] for lab in plain.train_index.labels]
    assert all((a == b[:, 1:]).all() for a, b in zip(boxes, single.train_index.labels))


def test_options_and_the_medium_recipe():
    from yolov5_smddp.config.hyp import load_hyp
    from yolov5_smddp.config.train_config import parse_train_args

    config = parse_train_args(
        ["--weights", "w.pt", "--allow-partial-transfer", "--noautoanchor", "--resume", "a/last.pt"]
        + ["--save-period", "5"]
    )
    assert config.cfg is None and config.allow_partial_transfer and config.noautoanchor
    assert (config.resume, config.save_period) == ("a/last.pt", 5)
    with pytest.raises(ConfigError, match="--save-period"):
        parse_train_args(["--save-period", "0"])
    med, high = load_hyp("scratch-med"), load_hyp("scratch-high")
    assert {k for k in med if med[k] != high[k]} == {"copy_paste"} and med["copy_paste"] == 0.0
    assert (med["lrf"], med["cls"], med["obj"], med["scale"], med["mixup"]) == (0.1, 0.3, 0.7, 0.9, 0.1)
