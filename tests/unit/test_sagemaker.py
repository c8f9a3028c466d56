"""The SageMaker contract module against fake /opt/ml trees (SAGEMAKER_BASE_DIR) and SM_* dicts."""

import json
import tempfile
from pathlib import Path

import pytest

from yolov5_smddp.config.train_config import parse_train_args
from yolov5_smddp.errors import ConfigError, DataError
from yolov5_smddp.sagemaker import main
from yolov5_smddp.sagemaker.dataset import prepare_data_yaml
from yolov5_smddp.sagemaker.driver import job_config, location_options
from yolov5_smddp.sagemaker.env import SageMakerEnv, read_environment
from yolov5_smddp.sagemaker.failure import failure_reason, write_failure
from yolov5_smddp.sagemaker.local_config import hyperparameters_from_cli, write_local_config


def _fake_opt_ml(
    base: Path, *, hosts=("algo-1", "algo-2"), current="algo-2", hps=None, channels=("training",)
):
    config = base / "input" / "config"
    config.mkdir(parents=True)
    (config / "resourceconfig.json").write_text(
        json.dumps(
            {
                "current_host": current,
                "hosts": list(hosts),
                "current_instance_type": "ml.p4d.24xlarge",
                "network_interface_name": "eth1",
            }
        )
    )
    (config / "hyperparameters.json").write_text(json.dumps(hps or {}))
    (config / "inputdataconfig.json").write_text(
        json.dumps({c: {"TrainingInputMode": "File"} for c in channels})
    )
    for c in channels:
        (base / "input" / "data" / c).mkdir(parents=True)
    return base


def test_nothing_set_is_one_local_host(tmp_path):
    env = read_environment({"SAGEMAKER_BASE_DIR": str(tmp_path)}, hostname="laptop", cpu_count=3)
    assert env == SageMakerEnv(
        base_dir=tmp_path,
        hosts=["laptop"],
        current_host="laptop",
        num_gpus=None,
        num_cpus=3,
        channels={},
        model_dir=tmp_path / "model",
        output_dir=tmp_path / "output",
        output_data_dir=tmp_path / "output" / "data",
        intermediate_dir=tmp_path / "output" / "intermediate",
        checkpoint_dir=tmp_path / "checkpoints",
        hyperparameters={},
        framework_params={},
        instance_type=None,
        network_interface="eth0",
        on_sagemaker=False,
    )
    assert (env.node_rank, env.master_addr) == (0, "laptop")


def test_config_files_fallback_when_sm_variables_are_absent(tmp_path):
    """An mpirun rank started over ssh has no SM_*: the /opt/ml/input/config files describe the job."""
    _fake_opt_ml(
        tmp_path,
        hps={
            "epochs": "3",
            "cfg": '"yolov5n"',
            "sagemaker_distributed_dataparallel_enabled": "true",
            "sagemaker_instance_type": '"ml.p4d.24xlarge"',
        },
    )
    env = read_environment({"SAGEMAKER_BASE_DIR": str(tmp_path)}, hostname="ignored", cpu_count=96)
    assert env.hosts == ["algo-1", "algo-2"] and env.current_host == "algo-2"
    assert (env.node_rank, env.master_addr) == (1, "algo-1")
    assert env.hyperparameters == {"epochs": 3, "cfg": "yolov5n"}
    assert env.framework_params == {
        "sagemaker_distributed_dataparallel_enabled": True,
        "sagemaker_instance_type": "ml.p4d.24xlarge",
    }
    assert env.channels == {"training": tmp_path / "input" / "data" / "training"}
    assert (env.instance_type, env.network_interface, env.on_sagemaker) == ("ml.p4d.24xlarge", "eth1", True)


def test_sm_variables_win_over_files(tmp_path):
    _fake_opt_ml(tmp_path)
    environ = {
        "SAGEMAKER_BASE_DIR": str(tmp_path),
        "SM_HOSTS": '["algo-2","algo-1","algo-3"]',
        "SM_CURRENT_HOST": "algo-3",
        "SM_NUM_GPUS": "8",
        "SM_NUM_CPUS": "96",
        "SM_CHANNELS": '["training","validation"]',
        "SM_CHANNEL_TRAINING": "/mnt/fsx/coco",
        "SM_MODEL_DIR": "/m",
        "SM_OUTPUT_DATA_DIR": "/o/data",
        "SM_HPS": '{"epochs": 5, "sagemaker_program": "entrypoint.py"}',
        "SM_FRAMEWORK_PARAMS": "{}",
    }
    env = read_environment(environ, cpu_count=1)
    assert env.hosts == ["algo-1", "algo-2", "algo-3"] and env.node_rank == 2
    assert (env.num_gpus, env.num_cpus) == (8, 96)
    assert env.channels == {
        "training": Path("/mnt/fsx/coco"),
        "validation": tmp_path / "input/data/validation",
    }
    assert (env.model_dir, env.output_data_dir) == (Path("/m"), Path("/o/data"))
    assert env.hyperparameters == {"epochs": 5} and env.framework_params == {}


def test_output_root_moves_all_outputs(tmp_path):
    env = read_environment(
        {"SAGEMAKER_BASE_DIR": str(tmp_path / "ml")}, hostname="h", output_root=tmp_path / "run"
    )
    assert env.model_dir == tmp_path / "run" / "model"
    assert env.output_data_dir == tmp_path / "run" / "output" / "data"
    assert env.checkpoint_dir == tmp_path / "run" / "checkpoints"
    assert env.failure_file == tmp_path / "run" / "output" / "failure"
    assert env.cache_dir == Path(tempfile.gettempdir()) / "yolov5-smddp-cache"  # not an output


def test_cache_folder_is_the_warm_pool_cache_else_local_never_an_upload(tmp_path):
    plain = read_environment({"SAGEMAKER_BASE_DIR": str(tmp_path)}, hostname="h")
    assert plain.warmpool_cache_dir is None
    assert plain.cache_dir == Path(tempfile.gettempdir()) / "yolov5-smddp-cache"
    warm = read_environment(
        {
            "SAGEMAKER_BASE_DIR": str(tmp_path),
            "SAGEMAKER_MANAGED_WARMPOOL_CACHE_DIRECTORY": "/opt/ml/sagemaker/warmpoolcache",
        },
        hostname="h",
    )
    assert warm.cache_dir == Path("/opt/ml/sagemaker/warmpoolcache/yolov5-smddp")
    for env in (plain, warm):
        assert not env.cache_dir.is_relative_to(env.output_dir)
        assert location_options(env, parse_train_args([]))["cache_dir"] == str(env.cache_dir)


def test_bad_json_and_unknown_host_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="SM_HOSTS"):
        read_environment({"SAGEMAKER_BASE_DIR": str(tmp_path), "SM_HOSTS": "[algo-1"})
    with pytest.raises(ConfigError, match="'algo-9'"):
        read_environment(
            {"SAGEMAKER_BASE_DIR": str(tmp_path), "SM_HOSTS": '["algo-1"]', "SM_CURRENT_HOST": "algo-9"}
        )
    (tmp_path / "input" / "config").mkdir(parents=True)
    (tmp_path / "input" / "config" / "resourceconfig.json").write_text("{not json")
    with pytest.raises(ConfigError, match="resourceconfig.json"):
        read_environment({"SAGEMAKER_BASE_DIR": str(tmp_path)})


def test_hyperparameters_from_cli_are_sagemaker_json_strings():
    assert hyperparameters_from_cli(
        ["--epochs", "3", "--rect", "--cfg=yolov5n", "--batch_size", "8", "--noval"]
    ) == {"epochs": "3", "rect": "true", "cfg": '"yolov5n"', "batch_size": "8", "noval": "true"}
    with pytest.raises(ConfigError, match="'oops'"):
        hyperparameters_from_cli(["oops"])


def test_write_local_config_only_when_none_is_mounted(tmp_path):
    (tmp_path / "input" / "data" / "training").mkdir(parents=True)
    environ = {"SAGEMAKER_BASE_DIR": str(tmp_path)}
    config_dir = write_local_config(environ, ["--epochs", "1"], hostname="abc123")
    assert config_dir == tmp_path / "input" / "config"
    resource = json.loads((config_dir / "resourceconfig.json").read_text())
    assert (resource["current_host"], resource["hosts"]) == ("abc123", ["abc123"])
    assert json.loads((config_dir / "hyperparameters.json").read_text()) == {"epochs": "1"}
    assert list(json.loads((config_dir / "inputdataconfig.json").read_text())) == ["training"]
    env = read_environment(environ)
    assert env.hyperparameters == {"epochs": 1} and env.current_host == "abc123"
    # a mounted (or already written) config is left exactly as it is
    before = (config_dir / "hyperparameters.json").read_text()
    assert write_local_config(environ, ["--epochs", "9"], hostname="other") is None
    assert (config_dir / "hyperparameters.json").read_text() == before


def test_location_options_fill_only_what_the_user_did_not_set(tmp_path):
    env = read_environment({"SAGEMAKER_BASE_DIR": str(tmp_path)}, hostname="h")
    config = parse_train_args(["--epochs", "1", "--model_dir", "/mine", "--cache-dir=/c"])
    assert location_options(env, config) == {
        "output_dir": str(tmp_path / "output/data"),
        "checkpoint_dir": str(tmp_path / "checkpoints"),
        "tensorboard_dir": str(tmp_path / "output/tensorboard"),
    }


def test_job_config_is_the_parsed_config_with_the_jobs_folders_data_and_weights(tmp_path):
    """What the workers train: the user's options as parsed, the folders, job name, data and weights the
    driver decided, every one of them counted as given (as the options it once appended were)."""
    env = read_environment({"SAGEMAKER_BASE_DIR": str(tmp_path), "TRAINING_JOB_NAME": "job-7"}, hostname="h")
    config = parse_train_args(
        ["--epochs", "3", "--model_dir", "/mine", "--freeze", "2", "--data", "mine.yaml"]
    )
    worker = job_config(env, config, data_yaml=tmp_path / "d.yaml", weights=tmp_path / "w.pt")
    assert (worker.epochs, worker.model_dir, worker.freeze) == (3, "/mine", [0, 1])
    assert (worker.data, worker.weights, worker.run_name) == (
        str(tmp_path / "d.yaml"),
        str(tmp_path / "w.pt"),
        "job-7",
    )
    assert (worker.output_dir, worker.checkpoint_dir) == (
        str(tmp_path / "output/data"),
        str(tmp_path / "checkpoints"),
    )
    assert worker.given == config.given | {
        "output_dir",
        "checkpoint_dir",
        "cache_dir",
        "tensorboard_dir",
        "run_name",
        "data",
        "weights",
    }
    untouched = job_config(env, parse_train_args(["--run-name", "mine"]), data_yaml=None, weights=None)
    assert (untouched.run_name, untouched.data, untouched.weights) == ("mine", None, None)


def _write_dataset(root: Path) -> None:
    for split in ("train", "val"):
        (root / "images" / split).mkdir(parents=True)
        (root / "labels" / split).mkdir(parents=True)
    (root / "data.yaml").write_text(
        "path: /home/someone/datasets/tiny\ntrain: images/train\nval: images/val\nnames: [cat, dog]\n"
    )


def test_prepare_data_yaml_rebases_onto_the_channel(tmp_path):
    base = _fake_opt_ml(tmp_path / "ml", hosts=("algo-1",), current="algo-1", channels=("training", "val"))
    channel = base / "input" / "data" / "training"
    _write_dataset(channel)
    env = read_environment(
        {
            "SAGEMAKER_BASE_DIR": str(base),
            "SAGEMAKER_MANAGED_WARMPOOL_CACHE_DIRECTORY": str(tmp_path / "warm"),
        }
    )
    out = prepare_data_yaml(env, None)
    assert out == tmp_path / "warm" / "yolov5-smddp" / "data" / "data.yaml"
    assert not (base / "output").exists()  # nothing for SageMaker to upload
    import yaml

    rebased = yaml.safe_load(out.read_text())
    assert rebased == {
        "path": str(channel.resolve()),
        "train": [str((channel / "images/train").resolve())],
        "val": [str(base / "input" / "data" / "val")],
        "names": ["cat", "dog"],
        "nc": 2,
    }


def test_prepare_data_yaml_writes_under_the_given_cache_dir(tmp_path):
    """--cache-dir given: the rebased data.yaml (and any COCO parse) goes there, not to the job's folder."""
    base = _fake_opt_ml(tmp_path / "ml", hosts=("algo-1",), current="algo-1")
    _write_dataset(base / "input" / "data" / "training")
    env = read_environment(
        {
            "SAGEMAKER_BASE_DIR": str(base),
            "SAGEMAKER_MANAGED_WARMPOOL_CACHE_DIRECTORY": str(tmp_path / "warm"),
        }
    )
    out = prepare_data_yaml(env, None, tmp_path / "mine")
    assert out == tmp_path / "mine" / "data" / "data.yaml" and out.is_file()
    assert not (tmp_path / "warm").exists()


def test_prepare_data_yaml_errors_name_the_channel(tmp_path):
    base = _fake_opt_ml(tmp_path / "ml", hosts=("algo-1",), current="algo-1")
    channel = base / "input" / "data" / "training"
    (channel / "coco.yaml").write_text("train: x\n")
    env = read_environment({"SAGEMAKER_BASE_DIR": str(base)})
    with pytest.raises(DataError, match=f"{channel}: data.yaml not found .*coco.yaml"):
        prepare_data_yaml(env, None)
    with pytest.raises(DataError, match="coco.yaml"):
        prepare_data_yaml(env, "coco.yaml")
    no_channel = read_environment({"SAGEMAKER_BASE_DIR": str(tmp_path / "empty")}, hostname="h")
    assert prepare_data_yaml(no_channel, None) is None


def test_a_looping_data_yaml_link_in_the_channel_is_named_as_one(tmp_path):
    base = _fake_opt_ml(tmp_path / "ml", hosts=("algo-1",), current="algo-1")
    channel = base / "input" / "data" / "training"
    (channel / "data.yaml").symlink_to("data.yaml")
    env = read_environment({"SAGEMAKER_BASE_DIR": str(base)})
    with pytest.raises(DataError) as refused:
        prepare_data_yaml(env, None)
    assert str(refused.value) == (
        f"training channel {channel}: data.yaml is a symbolic link that cannot be followed "
        "(a link loop or a dangling link: 'data.yaml')"
    )


def test_failure_file_reason_comes_first(tmp_path):
    path = tmp_path / "output" / "failure"
    reason = failure_reason(DataError("training channel /opt/ml/input/data/training: data.yaml not found"))
    assert reason == "Dataset problem: training channel /opt/ml/input/data/training: data.yaml not found"
    write_failure(path, reason, "Traceback (most recent call last):\n ...")
    assert path.read_text().startswith(reason + "\n\nTraceback")
    assert failure_reason(ValueError("x\ny")).startswith("Training failed with ValueError: x y.")


def test_main_invalid_hyperparameter_fails_before_any_work(tmp_path, capsys):
    pytest.importorskip("yaml")
    base = _fake_opt_ml(tmp_path, hosts=("algo-1",), current="algo-1", channels=())
    code = main(["--epochs", "0", "--cfg", "yolov5n"], environ={"SAGEMAKER_BASE_DIR": str(base)})
    assert code == 2
    failure = (base / "output" / "failure").read_text()
    assert failure.splitlines()[0].startswith("Invalid hyperparameter or option: ")
    assert "--epochs" in failure.splitlines()[0]
    assert not (base / "model").exists()  # nothing was started


def test_main_unknown_hyperparameter_is_named(tmp_path):
    base = _fake_opt_ml(tmp_path, hosts=("algo-1",), current="algo-1", channels=())
    assert main(["--epochz", "3"], environ={"SAGEMAKER_BASE_DIR": str(base)}) == 2
    assert "--epochz" in (base / "output" / "failure").read_text().splitlines()[0]


def test_only_the_sagemaker_package_reads_sm_variables():
    import re

    package = Path(__file__).resolve().parents[2] / "yolov5_smddp"
    readers = sorted(
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if "sagemaker" not in path.relative_to(package).parts[:1]
        and re.search(r"""["']SM_[A-Z_]+["']""", path.read_text())
    )
    assert readers == []


@pytest.mark.parametrize(
    "ompi, expected",
    [
        (  # 2 hosts x 1 worker, the rank on algo-2
            {"RANK": "1", "SIZE": "2", "LOCAL_RANK": "0", "LOCAL_SIZE": "1", "NODE_RANK": "0"},
            "launch: mpirun, 2 host(s) x 1 worker(s), this host algo-2 (node 1), master algo-1:7777",
        ),
        (  # the same rank as the stand-in's Open MPI described it (both ranks counted as local)
            {"RANK": "1", "SIZE": "2", "LOCAL_RANK": "1", "LOCAL_SIZE": "2", "NODE_RANK": "1"},
            "launch: mpirun, 2 host(s) x 1 worker(s), this host algo-2 (node 1), master algo-1:7777",
        ),
        (  # 2 hosts x 8 workers, local rank 3 on algo-2
            {"RANK": "11", "SIZE": "16", "LOCAL_RANK": "3", "LOCAL_SIZE": "8", "NODE_RANK": "3"},
            "launch: mpirun, 2 host(s) x 8 worker(s), this host algo-2 (node 1), master algo-1:7777",
        ),
    ],
)
def test_under_the_toolkits_mpirun_each_rank_names_its_own_host(
    tmp_path, monkeypatch, caplog, ompi, expected
):
    """The toolkit's mpirun hands algo-1's SM_CURRENT_HOST to every rank (`-x`); the rank's place comes from
    Open MPI's variables, read once, and the worker in this process gets that same place."""
    from yolov5_smddp.sagemaker import driver

    _fake_opt_ml(tmp_path, hosts=("algo-1", "algo-2"), current="algo-1", channels=())
    seen = []
    monkeypatch.setattr(driver, "run_config", lambda config, info: seen.append(info) or 0)
    caplog.set_level("INFO", logger="yolov5_smddp.sagemaker")
    environ = {
        "SAGEMAKER_BASE_DIR": str(tmp_path),
        "SM_HOSTS": '["algo-1", "algo-2"]',
        "SM_CURRENT_HOST": "algo-1",
        "SM_NUM_GPUS": "8",
        **{f"OMPI_COMM_WORLD_{k}": v for k, v in ompi.items()},
    }
    assert main(["--epochs", "1", "--cfg", "yolov5n"], environ=environ) == 0
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("launch:")] == [expected]
    (info,) = seen
    assert (info.launcher, info.rank, info.node_rank, info.nnodes, info.master_addr, info.master_port) == (
        "mpirun",
        int(ompi["RANK"]),
        1,
        2,
        "algo-1",
        7777,
    )
    assert info.instance_type == "ml.p4d.24xlarge"  # resourceconfig's, for the backend decision and SMDDP


def test_a_channel_of_images_and_one_coco_json_needs_no_data_yaml(tmp_path):
    from cocotree import write_coco_dataset

    from yolov5_smddp.data.config import load_data_config
    from yolov5_smddp.sagemaker.dataset import check_dataset

    base = _fake_opt_ml(
        tmp_path / "ml", hosts=("algo-1",), current="algo-1", channels=("training", "validation")
    )
    train = base / "input" / "data" / "training"
    val = base / "input" / "data" / "validation"
    write_coco_dataset(train, n_images=4, seed=1, image_folder="pics", relative_to_json=True)
    write_coco_dataset(val, n_images=3, seed=2, json_name="val.json")
    env = read_environment(
        {"SAGEMAKER_BASE_DIR": str(base), "SAGEMAKER_MANAGED_WARMPOOL_CACHE_DIRECTORY": str(tmp_path / "w")}
    )
    out = prepare_data_yaml(env, None)
    config = load_data_config(out, cache_dir=env.cache_dir)
    assert config.train == [(train / "instances.json").resolve()] and config.val == [val / "val.json"]
    assert config.names == ["three", "seven", "ninety"]
    check_dataset(out, env, cache_dir=env.cache_dir, max_pixels=2**27)  # both JSONs index
    assert sorted(p.name for p in env.cache_dir.glob("*.cocoindex.npz")) and not list(train.glob("*.npz"))


def test_a_stop_by_sigterm_is_one_line_and_the_reason_no_traceback(tmp_path, monkeypatch, caplog):
    """The trainer returns 143 after a SIGTERM (checkpoint and model folder written): the entrypoint
    exits 143 with one STOPPED line, and the failure file says what the folders hold; no traceback."""
    from yolov5_smddp.sagemaker import driver

    _fake_opt_ml(tmp_path, hosts=("algo-1",), current="algo-1", channels=())
    monkeypatch.setattr(driver, "run_config", lambda config, info: 143)
    caplog.set_level("INFO")
    assert main(["--epochs", "1", "--cfg", "yolov5n"], environ={"SAGEMAKER_BASE_DIR": str(tmp_path)}) == 143
    stopped = [r.getMessage() for r in caplog.records if "SIGTERM" in r.getMessage()]
    assert len(stopped) == 1 and stopped[0].startswith("STOPPED: Training was stopped by SIGTERM"), stopped
    assert not [r for r in caplog.records if "Traceback" in r.getMessage() or r.exc_info]
    failure = (tmp_path / "output" / "failure").read_text()
    assert failure.startswith("Training was stopped by SIGTERM") and "Traceback" not in failure
    assert f"{tmp_path / 'model'} holds the model so far" in failure
    assert f"the last checkpoint is in {tmp_path / 'checkpoints'}" in failure
