from pathlib import Path

import pytest

from yolov5_smddp.config.batch import plan_batch
from yolov5_smddp.config.hyp import load_hyp
from yolov5_smddp.config.output_dirs import resolve_output_dirs
from yolov5_smddp.config.train_config import TrainConfig, parse_train_args
from yolov5_smddp.errors import ConfigError


def test_both_spellings_and_bool_forms():
    c = parse_train_args(
        ["--batch_size", "32", "--cos-lr", "--rect", "false", "--sync_bn", "True", "--epochs", "3"]
    )
    assert c.batch_size == 32 and c.cos_lr is True and c.rect is False and c.sync_bn is True and c.epochs == 3
    assert parse_train_args(["--multi-scale", "1"]).multi_scale is True
    assert parse_train_args(["--channels_last=0"]).channels_last is False


def test_defaults_are_the_release_recipe():
    c = parse_train_args([])
    assert (c.epochs, c.imgsz, c.optimizer, c.patience, c.hyp, c.amp, c.backend) == (
        100,
        640,
        "SGD",
        100,
        "scratch-low",
        "auto",
        "auto",
    )


def test_json_ish_values():
    c = parse_train_args(["--freeze", "[0, 1, 2]", "--hyp-override", '{"lr0": 0.02}', "--data", '"d.yaml"'])
    assert c.freeze == [0, 1, 2] and c.hyp_overrides == {"lr0": 0.02} and c.data == "d.yaml"
    assert parse_train_args(["--freeze", "10"]).freeze == list(range(10))
    assert parse_train_args(["--hyp-override", "lr0=0.02,mosaic=0"]).hyp_overrides == {
        "lr0": 0.02,
        "mosaic": 0.0,
    }
    assert parse_train_args(["--optimizer", "adamw"]).optimizer == "AdamW"
    assert parse_train_args([]).max_image_pixels == 2**27
    assert parse_train_args(["--max_image_pixels", "1000000"]).max_image_pixels == 1_000_000


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--epochs", "0"], "--epochs"),
        (["--imgsz", "100"], "--imgsz"),
        (["--amp", "fp8"], "--amp"),
        (["--no-such-option", "1"], "--no-such-option"),
        (["--rect", "maybe"], "--rect"),
        (["--hyp-override", "lr0=5"], "lr0"),
        (["--hyp-override", "warp=1"], "warp"),
        (["--cache", "nvme"], "--cache"),
        (["--log-every", "0"], "--log-every"),
        (["--max-image-pixels", "0"], "--max-image-pixels"),
        (["--max_image_pixels", "1e8"], "max_image_pixels"),
    ],
)
def test_bad_values_name_the_option(argv, needle):
    with pytest.raises(ConfigError, match=needle):
        parse_train_args(argv)


def test_batch_plan():
    plan = plan_batch(64, None, 8)
    assert (plan.global_batch, plan.per_rank) == (64, 8)
    p = plan_batch(None, 16, 4)
    assert (p.global_batch, p.per_rank) == (64, 16)
    assert plan_batch(None, None, 1).global_batch == 16
    with pytest.raises(ConfigError, match="divisible by the world size 3"):
        plan_batch(16, None, 3)
    with pytest.raises(ConfigError, match="contradicts"):
        plan_batch(32, 16, 4)


def test_hyp_files_and_overrides(tmp_path):
    low, high = load_hyp("scratch-low"), load_hyp("hyp.scratch-high.yaml")
    assert low["lr0"] == 0.01 and low["lrf"] == 0.01 and low["box"] == 0.05 and low["warmup_bias_lr"] == 0.1
    assert (high["lrf"], high["cls"], high["obj"], high["scale"], high["mixup"], high["copy_paste"]) == (
        0.1,
        0.3,
        0.7,
        0.9,
        0.1,
        0.1,
    )
    assert load_hyp("scratch-low", {"mosaic": 0.0})["mosaic"] == 0.0
    custom = tmp_path / "h.yaml"
    custom.write_text("lr0: 0.02\n")
    assert load_hyp(str(custom))["lr0"] == 0.02 and load_hyp(str(custom))["momentum"] == 0.937
    custom.write_text("lr0: 0.02\nbogus: 1\n")
    with pytest.raises(ConfigError, match="bogus"):
        load_hyp(str(custom))
    custom.write_text("fliplr: 1.5\n")
    with pytest.raises(ConfigError, match="fliplr"):
        load_hyp(str(custom))
    with pytest.raises(ConfigError, match="--hyp"):
        load_hyp("scratch-medium")


def test_config_is_kw_only_and_serialisable(tmp_path):
    with pytest.raises(TypeError):
        TrainConfig("data.yaml")  # type: ignore[misc]
    d = TrainConfig(epochs=2).to_dict()
    assert d["epochs"] == 2 and d["freeze"] == []
    dirs = resolve_output_dirs(TrainConfig(model_dir="/m"), tmp_path, {}, Path("/home/me"))
    assert (
        str(dirs.model_dir) == "/m"
        and dirs.checkpoint_dir == tmp_path / "runs" / "train" / "exp" / "checkpoints"
    )
    # caches: the user's cache folder, never the run folder nor a dataset
    assert dirs.cache_dir == Path("/home/me/.cache/yolov5-smddp")
    xdg = resolve_output_dirs(TrainConfig(), tmp_path, {"XDG_CACHE_HOME": "/xdg"}, Path("/home/me"))
    assert xdg.cache_dir == Path("/xdg/yolov5-smddp")
    given = resolve_output_dirs(TrainConfig(cache_dir="/c"), tmp_path, {"XDG_CACHE_HOME": "/xdg"})
    assert given.cache_dir == Path("/c")


def test_hyp_keys_are_declared_once():
    """`Hyp` declares the keys and ranges; the shipped YAMLs hold every key, and the augmentation and loss
    defaults use the same names and scratch-low's values."""
    from dataclasses import fields

    from yolov5_smddp.config.hyp import HYP_RANGES, Hyp
    from yolov5_smddp.data.augment import AugmentParams
    from yolov5_smddp.detection.loss import HYP_DEFAULTS

    low = load_hyp("scratch-low")
    assert tuple(low) == Hyp.keys() == tuple(HYP_RANGES)
    assert tuple(load_hyp("scratch-high")) == Hyp.keys()
    assert Hyp(**low).lr0 == 0.01
    augment = {f.name: f.default for f in fields(AugmentParams)}
    assert augment == {k: low[k] for k in augment}
    loss = {k: v for k, v in HYP_DEFAULTS.items() if k != "label_smoothing"}
    assert loss == {k: low[k] for k in loss}
    assert HYP_RANGES["perspective"] == (0.0, 0.001) and HYP_RANGES["anchor_t"] == (1.0, 100.0)


def test_hyp_is_typed_and_frozen_and_converts_at_the_boundary():
    """The code reads `Hyp` attributes; the YAML's, checkpoints' and config.json's key: value form
    converts both ways unchanged (same keys, order and values); a mapping missing a key is refused."""
    import dataclasses

    from yolov5_smddp.config.hyp import Hyp

    low = load_hyp("scratch-low", {"lr0": 0.02})
    hyp = Hyp.from_dict(low)
    assert (hyp.lr0, hyp.anchor_t, hyp.mosaic) == (0.02, 4.0, 1.0)
    assert hyp.to_dict() == low and list(hyp.to_dict()) == list(low)
    with pytest.raises(dataclasses.FrozenInstanceError):
        hyp.lr0 = 0.1
    with pytest.raises(ConfigError, match=r"missing keys \['lrf'\], unknown keys \['lr1'\]"):
        Hyp.from_dict({**{k: v for k, v in low.items() if k != "lrf"}, "lr1": 0.1})


def test_the_run_reads_the_typed_hyp_and_its_checkpoint_keeps_the_mapping(tmp_path):
    """The hyp YAML's mapping typed once at the file boundary; the stack keeps the typed Hyp and the
    checkpoint records the plain mapping (weight_decay scaled: 64 images per step at global batch 16 x 4 accumulated, so unchanged)."""
    from yolov5_smddp.config.hyp import Hyp
    from yolov5_smddp.models.yolo import build_model
    from yolov5_smddp.train.engine import AmpPolicy
    from yolov5_smddp.train.optim_recipe import build_training_stack

    low = load_hyp("scratch-low")
    model = build_model("yolov5n", nc=2)
    stack = build_training_stack(
        model, Hyp.from_dict(low), nc=2, imgsz=64, global_batch=16, amp=AmpPolicy("off", "cpu")
    )
    assert isinstance(stack.hyp, Hyp) and stack.hyp.to_dict() == low
    big = build_training_stack(
        model, Hyp.from_dict(low), nc=2, imgsz=64, global_batch=48, amp=AmpPolicy("off", "cpu")
    )
    assert big.hyp.weight_decay == pytest.approx(low["weight_decay"] * 48 / 64)  # 48 images per step
    assert {**big.hyp.to_dict(), "weight_decay": low["weight_decay"]} == low
    # the loss got the gains scaled to 3 levels, 2 classes, 64 px
    assert big.criterion.gains == pytest.approx((low["box"], low["obj"] * 0.01, low["cls"] * 2 / 80))


def test_unused_hyperparameters_warn_only_when_set():
    from yolov5_smddp.config.hyp import unused_hyp_warnings

    low = load_hyp("scratch-low")
    assert unused_hyp_warnings(low, low) == []
    assert unused_hyp_warnings(load_hyp("scratch-low", {"copy_paste": 0.5, "iou_t": 0.3}), low) == [
        "hyperparameter iou_t=0.3 has no effect: the release's loss never reads it either; anchor_t decides",
        "hyperparameter copy_paste=0.5 has no effect: segment copy-paste needs polygon labels; boxes-only here",
    ]
    assert unused_hyp_warnings(load_hyp("scratch-high"), low) == [
        "hyperparameter copy_paste=0.1 has no effect: segment copy-paste needs polygon labels; boxes-only here"
    ]


def test_every_option_comes_from_a_field():
    """The command line is derived from TrainConfig: one option per field, both spellings, the dataclass
    defaults (argparse's stay None), Literal fields as case-insensitive choices."""
    import argparse
    from dataclasses import fields

    parser = argparse.ArgumentParser()
    from yolov5_smddp.config.train_config import add_train_arguments

    add_train_arguments(parser)
    actions = {a.dest: a for a in parser._actions if a.dest != "help"}
    assert set(actions) == {f.name for f in fields(TrainConfig)} - {"given"}
    assert all(a.default is None for a in actions.values())
    assert actions["batch_per_gpu"].option_strings == ["--batch-per-gpu", "--batch_per_gpu"]
    assert actions["imgsz"].option_strings == ["--imgsz", "--img-size", "--img_size", "--img"]
    assert actions["hyp_overrides"].option_strings[0] == "--hyp-override"
    assert parse_train_args(["--backend", "GLOO", "--amp", "BF16"]).backend == "gloo"
    assert parse_train_args(["--batch-size", "none", "--cache"]).cache == "ram"
    assert parse_train_args(["--cache", "disk"]).cache == "disk"
    assert parse_train_args(["--weights", "None"]).weights is None
