"""--time (budget.py): the epochs that fit, from measured (here: scripted) epoch times; the plan kept by a
checkpoint; the schedule decaying over the planned count; the option's validation."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from yolov5_smddp.config.batch import BatchPlan
from yolov5_smddp.config.hyp import Hyp, load_hyp
from yolov5_smddp.config.train_config import TrainConfig, parse_train_args
from yolov5_smddp.errors import ConfigError
from yolov5_smddp.train.budget import TimeBudget, counting_clock, epochs_within_budget
from yolov5_smddp.train.checkpoint import RunState
from yolov5_smddp.train.engine import lr_factor
from yolov5_smddp.train.trainer import Run


def test_epochs_that_fit_round_down():
    # 1 h budget, one 100 s epoch done: 3500 s left = 35 more epochs
    assert epochs_within_budget(3600, 100, 1, [100]) == 36
    assert epochs_within_budget(3600, 150, 1, [150]) == 1 + 23  # 3450 / 150 = 23
    assert epochs_within_budget(3600, 3599, 5, [700, 720, 720, 730, 729]) == 5  # 1 s left: none more
    assert epochs_within_budget(3600, 4000, 5, [800] * 5) == 5  # over the budget: stop now
    assert epochs_within_budget(1, 50, 1, [50]) == 1  # never below the epochs done, never 0


def test_the_sessions_first_epoch_is_left_out_of_the_mean_once_others_are_measured():
    # first epoch 300 s (start-up), then 100 s each: 3600 - 500 = 3100 s left / 100 = 31 more
    assert epochs_within_budget(3600, 500, 3, [300, 100, 100]) == 34
    assert epochs_within_budget(3600, 300, 1, [300]) == 1 + 11  # alone it is all there is: 3300 / 300


def test_no_epoch_measured_is_an_error():
    with pytest.raises(ValueError, match="no epoch measured"):
        epochs_within_budget(3600, 0, 0, [])


def test_a_budget_replans_after_every_epoch_with_a_faked_clock():
    times = iter([1000.0, 1400.0, 1500.0, 1600.0, 1700.0])  # start, then the end of each epoch's training
    budget = TimeBudget(hours=0.25, clock=lambda: next(times))  # 900 s
    budget.start()
    assert budget.plan(1) == 2  # 400 s used, 500 left / 400 = 1 more
    assert budget.plan(2) == 2 + 4  # 500 s used, 400 left / 100 (the first epoch left out) = 4 more
    assert budget.plan(3) == 6 and budget.plan(4) == 6
    assert budget.used == 700 and budget.epoch_seconds == [400, 100, 100, 100]


def test_a_restart_goes_on_with_the_budget_left():
    budget = TimeBudget(hours=1.0, used_before=3000.0, clock=counting_clock(120.0))
    budget.start()
    assert budget.plan(26) == 26 + 4  # 3120 s used, 480 left / 120 = 4 more
    assert budget.used == 3120.0


def test_the_checkpoint_keeps_the_seconds_used_and_the_plan():
    state = RunState(epoch=3, iteration=90, time_used=812.5, planned_epochs=17)
    again = RunState.from_checkpoint(state.to_checkpoint())
    assert (again.time_used, again.planned_epochs) == (812.5, 17)
    older = {k: v for k, v in state.to_checkpoint().items() if k not in ("time_used", "planned_epochs")}
    assert (RunState.from_checkpoint(older).time_used, RunState.from_checkpoint(older).planned_epochs) == (
        0.0,
        None,
    )


def test_the_learning_rate_decays_over_the_planned_epochs():
    hyp = load_hyp("scratch-low")
    config = TrainConfig(epochs=100, time=1.0)
    stack = SimpleNamespace(hyp=Hyp.from_dict(hyp))
    run = Run(
        config, None, None, BatchPlan(64, 64), None, None, None, stack, warmup_iters=100, batches_per_epoch=50
    )
    assert run.epochs == 100
    before = run.schedule.settings(300, 6).lrs["weight"]
    run.planned.count = 10  # the budget's plan (the one part of a Run that changes)
    after = run.schedule.settings(300, 6).lrs["weight"]
    assert before == pytest.approx(hyp["lr0"] * lr_factor(5, 100, hyp["lrf"], False))
    assert after == pytest.approx(hyp["lr0"] * lr_factor(5, 10, hyp["lrf"], False))


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "abc"])
def test_a_bad_time_is_a_clear_error(value):
    with pytest.raises(ConfigError, match="--time"):
        parse_train_args(["--time", value])


def test_time_parses_as_hours():
    assert parse_train_args(["--time", "1.5"]).time == 1.5
    assert parse_train_args([]).time is None
