"""The run resolved once (resolve.py): folders, resume point, hyperparameters, batch split and device
decided before any work; the device decision val shares with train (decisions.decide_device); the
schedule the engine asks (engine.Schedule)."""

from __future__ import annotations

import dataclasses

import torch

from yolov5_smddp.config.hyp import Hyp, load_hyp
from yolov5_smddp.config.output_dirs import OutputDirs
from yolov5_smddp.config.train_config import parse_train_args
from yolov5_smddp.data.augment import AugmentParams
from yolov5_smddp.distributed.process_group import DistInfo
from yolov5_smddp.train import checkpoint
from yolov5_smddp.train.decisions import decide_device
from yolov5_smddp.train.engine import AmpPolicy, Schedule
from yolov5_smddp.train.resolve import resolve_run

ONE_RANK = DistInfo(0, 0, 1, 1, 0, "127.0.0.1", 29500, "none")


def test_a_fresh_run_is_resolved_once_with_typed_values(tmp_path):
    config = parse_train_args(["--batch-size", "8", "--hyp-override", "lr0=0.02", "--cache-dir", "/c"])
    run = resolve_run(config, ONE_RANK, tmp_path)
    assert run.dirs.checkpoint_dir == tmp_path / "runs/train/exp/checkpoints"
    assert (run.resume_from, run.saved, run.resume_cfg, run.planned_epochs) == (
        None,
        None,
        None,
        config.epochs,
    )
    assert isinstance(run.decided.hyp, Hyp) and run.decided.hyp.lr0 == 0.02
    assert (run.decided.plan.global_batch, run.decided.plan.per_rank) == (8, 8)
    assert (run.decided.backend, run.decided.device_type, run.decided.amp.mode) == ("gloo", "cpu", "off")


def test_a_restarted_time_budget_run_keeps_its_plan_and_model(tmp_path):
    """A last.pt in the run's checkpoint folder is resumed: its options, model definition and (with --time)
    its planned epoch count come with the resolved run."""
    argv = ["--time", "1", "--epochs", "50", "--checkpoint-dir", str(tmp_path / "ck")]
    config = parse_train_args(argv)
    saved = {
        "config": config.to_dict(),
        "model_cfg": {"name": "tiny"},
        **checkpoint.RunState(epoch=2, iteration=20, planned_epochs=7).to_checkpoint(),
    }
    checkpoint.save_checkpoint(tmp_path / "ck", saved)
    run = resolve_run(parse_train_args(argv), ONE_RANK, tmp_path)
    assert run.resume_from == tmp_path / "ck" / checkpoint.LAST
    assert (run.planned_epochs, run.resume_cfg) == (7, {"name": "tiny"})
    assert isinstance(run.dirs, OutputDirs) and run.config.time == 1


def test_val_takes_the_device_decision_train_takes():
    """One process of `val` with --device takes that device (no process group); train's choice on the same
    machine goes through the backend decision; both get the precision policy of their device."""
    alone = decide_device("auto", "bf16", ONE_RANK, device="cpu")
    assert (alone.backend, alone.device_type, alone.amp) == (None, "cpu", AmpPolicy("bf16", "cpu"))
    auto = decide_device("auto", "auto", ONE_RANK, device="")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert (auto.backend, auto.device_type) == (None, expected)
    train = decide_device("auto", "auto", ONE_RANK)
    assert train.backend is not None and train.device_type == expected and train.amp == auto.amp


def test_the_schedule_decays_over_the_epochs_it_is_given():
    hyp = Hyp.from_dict(load_hyp("scratch-low"))
    kw = {"hyp": hyp, "warmup_iters": 10, "batches_per_epoch": 10, "cosine": False, "global_batch": 64}
    settings = Schedule(epochs=4, **kw).settings(35, 3)  # after warmup: epoch 3 trains at lr_factor(2)
    assert settings.lrs["weight"] == hyp.lr0 * ((1 - 2 / 4) * (1 - hyp.lrf) + hyp.lrf)
    assert settings.accumulate == 1 and settings.momentum == hyp.momentum


def test_the_data_reads_the_runs_typed_hyp():
    """The trainer hands data/ the typed Hyp: the augmentation values are its attributes."""
    hyp = dataclasses.replace(Hyp.from_dict(load_hyp("scratch-low")), mosaic=0.25, hsv_h=0.5)
    params = AugmentParams.from_hyp(hyp)
    assert (params.mosaic, params.hsv_h, params.fliplr, params.scale) == (0.25, 0.5, hyp.fliplr, hyp.scale)
    assert AugmentParams.from_hyp(None) == AugmentParams()
