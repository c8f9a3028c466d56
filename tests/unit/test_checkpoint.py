import random

import numpy as np
import pytest
import torch

from yolov5_smddp.errors import WeightsError
from yolov5_smddp.train import checkpoint


def test_round_trip_with_weights_only_and_rng(tmp_path):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    torch.manual_seed(1), np.random.seed(2), random.seed(3)
    state = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "epoch": 4,
        "rng": checkpoint.capture_rng_state(),
        "config": {"epochs": 5, "freeze": [], "data": None},
    }
    expected = (torch.rand(1).item(), np.random.rand(), random.random())
    path = checkpoint.save_checkpoint(tmp_path, state, best=True)
    assert path == tmp_path / "last.pt" and (tmp_path / "best.pt").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.pt", "last.pt"]  # no temporary left over
    loaded = checkpoint.load_checkpoint(path)
    torch.load(path, weights_only=True)  # plain data only
    assert loaded["epoch"] == 4 and torch.equal(loaded["model"]["weight"], model.state_dict()["weight"])
    checkpoint.restore_rng_state(loaded["rng"])
    assert (torch.rand(1).item(), np.random.rand(), random.random()) == expected


def test_truncated_or_foreign_files_are_weights_errors(tmp_path):
    path = checkpoint.save_checkpoint(tmp_path, {"epoch": 1})
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(WeightsError, match="last.pt"):
        checkpoint.load_checkpoint(path)
    torch.save({"epoch": 1}, path)
    with pytest.raises(WeightsError, match="not a yolov5-smddp training checkpoint"):
        checkpoint.load_checkpoint(path)


def test_failed_write_keeps_the_old_file(tmp_path, monkeypatch):
    checkpoint.save_checkpoint(tmp_path, {"epoch": 1})

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint.torch, "save", boom)
    with pytest.raises(OSError):
        checkpoint.save_checkpoint(tmp_path, {"epoch": 2})
    assert checkpoint.load_checkpoint(tmp_path / "last.pt")["epoch"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]
    assert checkpoint.find_resumable(tmp_path) == tmp_path / "last.pt"
    assert checkpoint.find_resumable(tmp_path / "nothing") is None


def test_interrupted_message_names_the_checkpoint_and_how_to_resume(tmp_path):
    from yolov5_smddp.train.checkpoint import interrupted_message

    assert interrupted_message("after epoch 2", tmp_path) == (
        f"interrupted after epoch 2: checkpoint {tmp_path / 'last.pt'} written; resume with --resume {tmp_path / 'last.pt'} "
        f"(a job given --checkpoint-dir {tmp_path} resumes it by itself)"
    )


def test_run_state_round_trips_through_a_checkpoint(tmp_path):
    from yolov5_smddp.train.checkpoint import RunState, load_checkpoint, save_checkpoint

    state = RunState(
        epoch=3, iteration=120, best_fitness=0.25, stale_epochs=1, history=[{"epoch": 1, "fitness": 0.25}]
    )
    assert state.to_checkpoint() == {
        "epoch": 3,
        "iteration": 120,
        "best_fitness": 0.25,
        "stale_epochs": 1,
        "history": [{"epoch": 1, "fitness": 0.25}],
        "time_used": 0.0,
        "planned_epochs": None,
    }
    save_checkpoint(tmp_path, state.to_checkpoint())
    restored = RunState.from_checkpoint(load_checkpoint(tmp_path / "last.pt"))
    assert restored == RunState(
        epoch=3,
        iteration=120,
        best_fitness=0.25,
        stale_epochs=1,
        history=[{"epoch": 1, "fitness": 0.25}],
        last_optimizer_iteration=119,
    )
    assert RunState() == RunState(0, 0, -1.0, 0, [], -1)
