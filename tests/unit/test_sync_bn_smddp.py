"""--sync-bn under SMDDP (issue 52, item 3): SyncBatchNorm's all_gather_into_tensor is not in AWS's list of
SMDDP collectives, so the combination is refused before any work, in one line."""

from __future__ import annotations

import dataclasses

import pytest

from yolov5_smddp.config.train_config import TrainConfig
from yolov5_smddp.distributed import process_group
from yolov5_smddp.errors import ConfigError
from yolov5_smddp.train import decisions


def _info(world: int) -> process_group.DistInfo:
    env = {"RANK": "0", "WORLD_SIZE": str(world), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": str(world)}
    return process_group.detect_dist_info(env)


def test_sync_bn_is_refused_under_smddp_on_several_ranks(monkeypatch):
    monkeypatch.setattr(process_group, "resolve", lambda requested, info, cuda: ("smddp", "cpu"))
    config = dataclasses.replace(TrainConfig(), sync_bn=True)
    with pytest.raises(ConfigError, match="--sync-bn with --backend smddp"):
        decisions.decide(config, _info(2))
    decisions.decide(dataclasses.replace(config, sync_bn=False), _info(2))  # without it: decided
