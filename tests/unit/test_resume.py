"""Resume as users expect (--resume [PATH], automatic resume, run folders), our training checkpoints as
weights everywhere, and resume across AMP modes."""

import dataclasses
import os
from pathlib import Path

import pytest
import torch

from yolov5_smddp.config.batch import BatchPlan
from yolov5_smddp.config.hyp import Hyp, load_hyp
from yolov5_smddp.config.output_dirs import OutputDirs, resolve_output_dirs, run_folder
from yolov5_smddp.config.resume import resume_run, resume_source
from yolov5_smddp.config.train_config import RESUME_FROM_COMMAND, TrainConfig, parse_train_args
from yolov5_smddp.distributed.process_group import DistInfo
from yolov5_smddp.errors import ConfigError, WeightsError
from yolov5_smddp.models.weights import load_model, load_weights, save_weights
from yolov5_smddp.models.yolo import build_model
from yolov5_smddp.train import checkpoint, resumption
from yolov5_smddp.train.engine import AmpPolicy
from yolov5_smddp.train.optim_recipe import build_training_stack
from yolov5_smddp.train.run_state import Run

ONE_RANK = DistInfo(0, 0, 1, 1, 0, "127.0.0.1", 29500, "none")


def _data(folder: Path, text: str = "path: .\ntrain: images\nval: images\nnames: [a, b, c]\n") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "data.yaml").write_text(text)
    return folder / "data.yaml"


def _run(config: TrainConfig, folder: Path, names=("a", "b", "c"), amp: str = "off") -> Run:
    """A Run of a tiny yolov5n whose checkpoint is what training writes (Run.checkpoint); `amp` "fp16"
    gives it an enabled loss scaler (torch's GradScaler works on CPU too)."""
    model = build_model("yolov5n", nc=len(names))
    model.names = list(names)
    stack = build_training_stack(
        model,
        Hyp.from_dict(load_hyp("scratch-low")),
        nc=len(names),
        imgsz=64,
        global_batch=8,
        amp=AmpPolicy(amp, "cpu"),
    )
    dirs = OutputDirs(
        model_dir=folder / "model",
        output_dir=folder / "output",
        checkpoint_dir=folder / "checkpoints",
        cache_dir=folder / "cache",
    )
    return Run(
        config,
        ONE_RANK,
        dirs,
        BatchPlan(8, 8),
        AmpPolicy(amp, "cpu"),
        torch.device("cpu"),
        model,
        stack,
    )


def _checkpoint(tmp_path: Path, argv: list[str], *, epoch: int = 1, folder: str = "runs/train/exp") -> Path:
    """checkpoints/last.pt of a run started with `argv`, after `epoch` epochs; its EMA differs from its model."""
    run = _run(parse_train_args(argv), tmp_path / folder)
    with torch.no_grad():
        for p in run.stack.ema.module.parameters():
            p.add_(0.25)
    return run.save(checkpoint.RunState(epoch=epoch, iteration=10 * epoch))


# ------------------------------------------------------------------------------------- --resume PATH


def test_resume_restores_the_runs_options_and_takes_only_the_machines_from_the_command(tmp_path):
    data = _data(tmp_path / "ds")
    run = ["--data", str(data), "--epochs", "4", "--imgsz", "64", "--batch-size", "8", "--cfg", "yolov5n"]
    saved = parse_train_args([*run, "--freeze", "1", "--workers", "2"]).to_dict()
    source = tmp_path / "last.pt"
    config = resume_run(parse_train_args(["--resume", str(source), "--workers", "0"]), saved, source)
    assert (config.data, config.epochs, config.imgsz, config.batch_size, config.cfg) == (
        str(data),
        4,
        64,
        8,
        "yolov5n",
    )
    assert (config.workers, config.freeze, config.resume) == (0, [0], str(source))
    # the same values again are no contradiction
    same = resume_run(parse_train_args(["--resume", str(source), *run]), saved, source)
    assert dataclasses.replace(same, given=frozenset()) == dataclasses.replace(
        config, workers=8, given=frozenset()
    )


def test_an_option_contradicting_the_resumed_run_is_refused_in_one_line(tmp_path):
    saved = parse_train_args(["--epochs", "4", "--imgsz", "64"]).to_dict()
    source = tmp_path / "r" / "last.pt"
    with pytest.raises(ConfigError) as refused:
        resume_run(parse_train_args(["--resume", str(source), "--epochs", "100"]), saved, source)
    assert str(refused.value) == (
        f"--epochs 100 contradicts the run being resumed ({source}: 4); resume without --epochs, or start a "
        f"new run from its weights with --weights {source}"
    )
    with pytest.raises(ConfigError, match=r"^--data ds/data.yaml contradicts .*: the default \(none\)\)"):
        resume_run(parse_train_args(["--resume", str(source), "--data", "ds/data.yaml"]), saved, source)


def test_the_data_may_move_but_not_change(tmp_path):
    data = _data(tmp_path / "ds")
    saved = parse_train_args(["--data", str(data)]).to_dict()
    source = tmp_path / "last.pt"
    moved = _data(tmp_path / "elsewhere")  # the same bytes: SageMaker's rebased copy, a copied dataset
    assert resume_run(
        parse_train_args(["--resume", str(source), "--data", str(moved)]), saved, source
    ).data == str(moved)
    other = _data(tmp_path / "other", "path: .\ntrain: images\nval: images\nnames: [a, b, d]\n")
    with pytest.raises(ConfigError, match="^--data .*other/data.yaml contradicts the run being resumed"):
        resume_run(parse_train_args(["--resume", str(source), "--data", str(other)]), saved, source)


def test_the_options_a_resume_takes_from_the_command_are_one_list_of_machine_and_folder_options():
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    assert set(RESUME_FROM_COMMAND) <= names
    run_defining = {
        "data",
        "cfg",
        "weights",
        "epochs",
        "imgsz",
        "batch_size",
        "batch_per_gpu",
        "hyp",
        "hyp_overrides",
        "optimizer",
        "freeze",
        "single_cls",
        "rect",
        "multi_scale",
        "seed",
        "cos_lr",
    }
    assert not run_defining & set(RESUME_FROM_COMMAND)
    assert {"workers", "amp", "loader", "model_dir", "output_dir", "checkpoint_dir", "cache_dir"} <= set(
        RESUME_FROM_COMMAND
    )
    assert "--workers" in TrainConfig.__dataclass_fields__["resume"].metadata["cli"]["help"]


def test_resume_spellings_and_the_releases_freeze_list():
    assert parse_train_args(["--resume"]).resume == ""
    assert parse_train_args(["--resume", "true"]).resume == ""
    assert parse_train_args(["--resume", "False"]).resume is None
    assert parse_train_args(["--freeze", "0", "1", "2"]).freeze == [0, 1, 2]
    assert parse_train_args(["--freeze", "3"]).freeze == [0, 1, 2]
    assert parse_train_args(["--freeze", "4,6"]).freeze == [4, 6]
    assert parse_train_args(["--freeze", "0", "1", "2"]).given == {"freeze"}
    assert "given" not in TrainConfig().to_dict()


# ----------------------------------------------------------------------------------------- run folders


def test_run_folders_do_not_collide(tmp_path):
    project = tmp_path / "runs" / "train"
    assert run_folder(project, "exp", False) == project / "exp"
    (project / "exp").mkdir(parents=True)
    assert run_folder(project, "exp", False) == project / "exp2"
    (project / "exp2").mkdir()
    assert run_folder(project, "exp", False) == project / "exp3"
    assert run_folder(project, "exp", True) == project / "exp"
    dirs = resolve_output_dirs(parse_train_args(["--name", "exp"]), tmp_path, {}, Path("/h"))
    assert (dirs.model_dir, dirs.output_dir, dirs.checkpoint_dir) == (
        project / "exp3" / "model",
        project / "exp3" / "output",
        project / "exp3" / "checkpoints",
    )
    given = resolve_output_dirs(
        parse_train_args(["--project", "p", "--name", "n", "--checkpoint-dir", "/c"]),
        tmp_path,
        {},
        Path("/h"),
    )
    assert (given.model_dir, given.checkpoint_dir) == (tmp_path / "p" / "n" / "model", Path("/c"))


def test_a_bare_resume_finds_the_newest_last_pt_and_writes_into_that_run(tmp_path):
    older = _checkpoint(tmp_path, ["--cfg", "yolov5n"], folder="runs/train/exp")
    newer = _checkpoint(tmp_path, ["--cfg", "yolov5n"], folder="runs/train/exp2")
    os.utime(older, ns=(2_000_000_000 * 10**9, 2_000_000_000 * 10**9))  # now the newest
    assert resume_source(parse_train_args(["--resume"]), tmp_path) == older
    dirs = resolve_output_dirs(parse_train_args(["--resume"]), tmp_path, {}, Path("/h"))
    run = tmp_path / "runs" / "train" / "exp"
    assert (dirs.resume_from, dirs.checkpoint_dir, dirs.model_dir) == (
        older,
        run / "checkpoints",
        run / "model",
    )
    assert (
        resume_source(parse_train_args(["--resume", "--checkpoint-dir", str(newer.parent)]), tmp_path)
        == newer
    )
    with pytest.raises(
        ConfigError, match="^--resume: no last.pt in the run folders under .*; give the checkpoint"
    ):
        resume_source(parse_train_args(["--resume", "--project", "nothing"]), tmp_path)
    with pytest.raises(ConfigError, match="^--resume gone.pt: no such file$"):
        resume_source(parse_train_args(["--resume", "gone.pt"]), tmp_path)


# ---------------------------------------------------------------------------- the trainer's resume decision


def _dirs(tmp_path, argv):
    return resolve_output_dirs(parse_train_args(argv), tmp_path, {}, Path("/h"))


def test_resume_path_gives_the_runs_config_and_refuses_a_finished_run(tmp_path):
    data = _data(tmp_path / "ds")
    last = _checkpoint(tmp_path, ["--cfg", "yolov5n", "--data", str(data), "--epochs", "4", "--imgsz", "64"])
    argv = ["--resume", str(last), "--workers", "1"]
    config, path, saved = resumption.resumable_checkpoint(parse_train_args(argv), _dirs(tmp_path, argv), True)
    assert (path, config.epochs, config.imgsz, config.data, config.workers, saved["epoch"]) == (
        last,
        4,
        64,
        str(data),
        1,
        1,
    )
    done = _checkpoint(tmp_path, ["--epochs", "2"], epoch=2, folder="done")
    with pytest.raises(
        ConfigError, match=r"that run has finished its 2 epochs, nothing to resume; .* --weights "
    ):
        resumption.resumable_checkpoint(
            parse_train_args(["--resume", str(done)]), _dirs(tmp_path, ["--resume", str(done)]), True
        )


def test_automatic_resume_never_replaces_an_explicit_cfg_weights_or_data(tmp_path):
    last = _checkpoint(tmp_path, ["--cfg", "yolov5n", "--epochs", "3"], folder="job")
    folder = str(last.parent)
    same = ["--checkpoint-dir", folder, "--cfg", "yolov5n", "--epochs", "3"]
    config, path, saved = resumption.resumable_checkpoint(parse_train_args(same), _dirs(tmp_path, same), True)
    assert path == last and saved["epoch"] == 1
    other = ["--checkpoint-dir", folder, "--cfg", "yolov5s", "--epochs", "3"]
    with pytest.raises(ConfigError) as refused:
        resumption.resumable_checkpoint(parse_train_args(other), _dirs(tmp_path, other), True)
    assert str(refused.value) == (
        f"{last} holds a run with --cfg yolov5n, not --cfg yolov5s: to continue that run, --resume {last}; "
        "to start afresh, --exist-ok (overwrites its checkpoints) or another --checkpoint-dir"
    )
    weights = ["--checkpoint-dir", folder, "--weights", "w.pt"]
    with pytest.raises(ConfigError, match=r"holds a run with --weights \(none\), not --weights w.pt"):
        resumption.resumable_checkpoint(parse_train_args(weights), _dirs(tmp_path, weights), True)
    fresh = [*other, "--exist-ok"]
    assert resumption.resumable_checkpoint(parse_train_args(fresh), _dirs(tmp_path, fresh), True)[1:] == (
        None,
        None,
    )


# ------------------------------------------------------------------------------- checkpoints as weights


@pytest.mark.parametrize("name", ["last.pt", "epoch1.pt", "best.pt"])
def test_every_training_checkpoint_loads_as_weights_with_its_ema(tmp_path, name):
    last = _checkpoint(tmp_path, ["--cfg", "yolov5n"])
    if name != "last.pt":
        (last.parent / name).write_bytes(last.read_bytes())
    saved = torch.load(last, weights_only=True)
    loaded = load_weights(last.parent / name)
    assert (loaded.source, loaded.nc, loaded.names) == ("training checkpoint", 3, ["a", "b", "c"])
    for key, tensor in saved["ema"]["state_dict"].items():
        assert torch.equal(loaded.state_dict[key], tensor), key
    assert not torch.equal(loaded.state_dict["model.0.conv.weight"], saved["model"]["model.0.conv.weight"])
    model = load_model(last.parent / name)
    assert model.names == ["a", "b", "c"] and not model.training
    torch.testing.assert_close(
        model.state_dict()["model.24.m.0.bias"], saved["ema"]["state_dict"]["model.24.m.0.bias"]
    )


def test_a_checkpoint_without_names_still_loads(tmp_path):
    last = _checkpoint(tmp_path, ["--cfg", "yolov5n"])
    state = torch.load(last, weights_only=True)
    del state["names"]  # as 0.x checkpoints were written
    torch.save(state, last)
    assert load_weights(last).names is None and load_model(last).nc == 3


# ------------------------------------------------------------------------------------ AMP modes


def test_loss_scaler_state_across_amp_modes():
    fp16_run = torch.amp.GradScaler("cpu", enabled=True, init_scale=1024.0)
    fp16_state = fp16_run.state_dict()
    bf16_state = torch.amp.GradScaler("cpu", enabled=False).state_dict()
    assert bf16_state == {}
    # bf16 (or fp32) checkpoint resumed under fp16: the scale starts afresh (torch alone raises here)
    scaler = torch.amp.GradScaler("cpu", enabled=True)
    assert resumption.restore_scaler(scaler, bf16_state) == (
        "amp: the checkpoint was trained without loss scaling (bf16 or fp32); fp16 starts its loss scale "
        "afresh at 65536"
    )
    assert scaler.get_scale() == 65536.0
    # fp16 -> fp16 keeps the scale; fp16 -> bf16 has none to keep
    kept = torch.amp.GradScaler("cpu", enabled=True)
    assert resumption.restore_scaler(kept, fp16_state) is None and kept.get_scale() == 1024.0
    off = torch.amp.GradScaler("cpu", enabled=False)
    assert (
        resumption.restore_scaler(off, fp16_state)
        == "amp: the checkpoint's fp16 loss scale 1024 is not needed now"
    )
    assert resumption.restore_scaler(off, bf16_state) is None


def test_a_bf16_run_resumes_under_fp16_and_back(tmp_path, caplog):
    """resumption.resume itself: torch alone raises "The source state dict is empty" for the first case."""
    bf16_last = _checkpoint(tmp_path, ["--cfg", "yolov5n", "--amp", "bf16"], folder="bf16")
    fp16 = _run(parse_train_args(["--amp", "fp16"]), tmp_path / "fp16", amp="fp16")
    with caplog.at_level("INFO", logger="yolov5_smddp"):
        state = resumption.resume(fp16, bf16_last, checkpoint.load_checkpoint(bf16_last))
    assert state.epoch == 1 and fp16.stack.scaler.get_scale() == 65536.0
    assert "fp16 starts its loss scale afresh at 65536" in caplog.text
    fp16.stack.scaler.scale(torch.ones(()))  # the scale tensor exists from the first step on
    fp16.stack.scaler.update(512.0)
    fp16_last = fp16.save(checkpoint.RunState(epoch=2, iteration=20))
    bf16 = _run(parse_train_args(["--amp", "bf16"]), tmp_path / "bf16again", amp="bf16")
    assert resumption.resume(bf16, fp16_last, checkpoint.load_checkpoint(fp16_last)).epoch == 2
    fp16_again = _run(parse_train_args(["--amp", "fp16"]), tmp_path / "fp16again", amp="fp16")
    resumption.resume(fp16_again, fp16_last, checkpoint.load_checkpoint(fp16_last))
    assert fp16_again.stack.scaler.get_scale() == 512.0


def test_resuming_what_is_not_a_training_checkpoint_says_what_to_do_in_one_line(tmp_path):
    release = Path(__file__).parents[1] / "fixtures" / "release_models" / "yolov5n.pt"
    with pytest.raises(WeightsError) as refused:
        checkpoint.load_checkpoint(release)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(
        f"checkpoint {release} is not a yolov5-smddp training checkpoint: it holds pickled objects ("
    )
    assert "DetectionModel" in message  # the safe loader's reason, not torch's advice
    assert message.endswith(
        f"); weights (a model folder's best.pt, the release's .pt) start a new run with --weights {release}"
    )
    ours = save_weights(tmp_path / "best.pt", build_model("yolov5n", nc=3), meta={})
    with pytest.raises(
        WeightsError, match=r"\(format yolov5-smddp-train-checkpoint/1\); weights .* --weights "
    ):
        checkpoint.load_checkpoint(ours)
    truncated = tmp_path / "last.pt"
    truncated.write_bytes(ours.read_bytes()[:1000])
    with pytest.raises(WeightsError) as damaged:
        checkpoint.load_checkpoint(truncated)
    assert "\n" not in str(damaged.value) and str(damaged.value).endswith("delete it to start afresh")


def test_the_cli_refuses_a_contradicting_option_with_one_error_line_and_exit_2(tmp_path, monkeypatch, capsys):
    from yolov5_smddp import cli

    last = _checkpoint(tmp_path, ["--cfg", "yolov5n", "--epochs", "4"])
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "--resume", str(last), "--epochs", "100"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"error: --epochs 100 contradicts the run being resumed ({last}: 4); resume without --epochs, or start "
        f"a new run from its weights with --weights {last}\n"
    )
    assert sorted(p.name for p in (tmp_path / "runs" / "train").iterdir()) == ["exp"]  # nothing new made
