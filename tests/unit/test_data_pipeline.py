"""The data wiring's one choice of cache folder and one label scan (data.cache.choose_cache_dir,
data_pipeline.scan_split), shared by the trainer, the SageMaker dataset check, `val` and `bench data`."""

from __future__ import annotations

from pathlib import Path

import pytest

from yolov5_smddp.data.cache import choose_cache_dir
from yolov5_smddp.data.config import load_data_config
from yolov5_smddp.train.data_wiring import scan_split


def test_the_cache_folder_is_the_given_one_then_the_jobs_then_the_users(tmp_path):
    home = tmp_path / "home"
    job = tmp_path / "warm" / "yolov5-smddp"
    xdg = {"XDG_CACHE_HOME": "/var/cache/me"}
    assert choose_cache_dir("/given", job_default=job, environ=xdg, home=home) == Path("/given")
    assert choose_cache_dir(Path("/given"), environ={}, home=home) == Path("/given")
    assert choose_cache_dir(None, job_default=job, environ=xdg, home=home) == job
    assert choose_cache_dir("", job_default=job, environ=xdg, home=home) == job
    assert choose_cache_dir(None, environ=xdg, home=home) == Path("/var/cache/me/yolov5-smddp")
    assert choose_cache_dir(None, environ={}, home=home) == home / ".cache" / "yolov5-smddp"


def test_the_output_folders_take_the_same_choice(tmp_path):
    from yolov5_smddp.config.output_dirs import resolve_output_dirs
    from yolov5_smddp.config.train_config import parse_train_args

    home = tmp_path / "home"
    default = resolve_output_dirs(parse_train_args([]), tmp_path, environ={}, home=home)
    assert default.cache_dir == home / ".cache" / "yolov5-smddp"
    given = resolve_output_dirs(parse_train_args(["--cache-dir", "/c"]), tmp_path, environ={}, home=home)
    assert given.cache_dir == Path("/c")


@pytest.mark.parametrize("split", ["train", "val"])
def test_scan_split_indexes_the_named_split_and_caches_under_cache_dir(tmp_path, split):
    from easy_shapes import make_easy_dataset

    data_yaml = make_easy_dataset(tmp_path / "d", n_train=6, n_val=3, seed=0)
    data = load_data_config(data_yaml, cache_dir=tmp_path / "cache")
    index = scan_split(data, split, cache_dir=tmp_path / "cache", workers=2, max_pixels=2**27)
    assert len(index.images) == {"train": 6, "val": 3}[split]
    assert all(p.parent == tmp_path / "d" / "images" / split for p in index.images)
    assert index.cache_path is not None and index.cache_path.parent == tmp_path / "cache"
    assert not list((tmp_path / "d").rglob("*.cache"))  # nothing written under the dataset
