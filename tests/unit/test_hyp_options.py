"""Per-key `--hyp-<key>` options (what a tuning job passes) folded into one --hyp-override."""

import json

import pytest
from child_python import run_python

from yolov5_smddp.config.hyp_options import fold_hyp_options, hyp_key, hyp_option
from yolov5_smddp.config.train_config import parse_train_args
from yolov5_smddp.errors import ConfigError
from yolov5_smddp.sagemaker import main


def test_names():
    assert hyp_option("weight_decay") == "hyp-weight_decay"
    assert hyp_key("hyp-lr0") == "lr0"
    assert hyp_key("hyp_weight-decay") == "weight_decay"
    assert hyp_key("hyp-weight_decay") == "weight_decay"
    for not_per_key in ("hyp", "hyp-", "hyp-override", "hyp_overrides", "epochs"):
        assert hyp_key(not_per_key) is None


def test_fold_exact_words():
    args = ["--epochs", "3", "--hyp-lr0", "0.02", "--hyp_weight-decay=0.001", "--rect"]
    assert fold_hyp_options(args) == [
        "--epochs",
        "3",
        "--rect",
        "--hyp-override",
        "lr0=0.02,weight_decay=0.001",
    ]


def test_fold_merges_an_existing_override_and_parses():
    args = ["--hyp-override", "mosaic=0,fliplr=0.25", "--hyp-lr0", "0.02", "--cfg", "yolov5n"]
    folded = fold_hyp_options(args)
    assert folded == ["--cfg", "yolov5n", "--hyp-override", "mosaic=0.0,fliplr=0.25,lr0=0.02"]
    config = parse_train_args(folded)
    assert config.hyp_overrides == {"mosaic": 0.0, "fliplr": 0.25, "lr0": 0.02}
    # a JSON override (a dict hyperparameter) merges the same way
    folded = fold_hyp_options(["--hyp_overrides", json.dumps({"mosaic": 0.5}), "--hyp-lr0=1e-3"])
    assert folded == ["--hyp-override", "mosaic=0.5,lr0=1e-3"]


def test_without_per_key_options_the_words_are_untouched():
    args = ["--hyp", "scratch-high", "--hyp-override", "lr0=0.02", "--epochs", "1"]
    assert fold_hyp_options(args) == args


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--hyp-lr9", "0.1"], "--hyp-lr9: unknown hyperparameter 'lr9'"),
        (["--hyp-lr0", "fast"], "--hyp-lr0: hyperparameter lr0='fast' is not a number"),
        (["--hyp-mosaic", "2"], r"--hyp-mosaic: hyperparameter mosaic=2.0 is out of range \[0.0, 1.0\]"),
        (["--hyp-lr0"], "--hyp-lr0 needs a value"),
        (["--hyp-lr0", "--epochs", "3"], "--hyp-lr0 needs a value"),
        (["--hyp-lr0", "0.1", "--hyp_lr0", "0.2"], "hyperparameter lr0 is given twice"),
        (
            ["--hyp-override", "lr0=0.01", "--hyp-lr0", "0.02"],
            r"lr0 is given twice: in --hyp-override \(0.01\) and as --hyp-lr0 \(0.02\)",
        ),
        (["--hyp-override", "lr0", "--hyp-mosaic", "1"], "--hyp-override: expected key=value"),
    ],
)
def test_fold_errors_name_the_option(args, message):
    with pytest.raises(ConfigError, match=message):
        fold_hyp_options(args)


def _single_host_opt_ml(base):
    config = base / "input" / "config"
    config.mkdir(parents=True)
    (config / "resourceconfig.json").write_text(json.dumps({"current_host": "algo-1", "hosts": ["algo-1"]}))
    (config / "hyperparameters.json").write_text("{}")
    (config / "inputdataconfig.json").write_text("{}")
    return base


def test_the_entrypoint_folds_before_it_validates(tmp_path):
    # a tuning job's per-key value reaches the hyperparameter check (and fails it here, before any work)
    base = _single_host_opt_ml(tmp_path)
    assert main(["--hyp-mosaic", "7", "--epochs", "1"], environ={"SAGEMAKER_BASE_DIR": str(base)}) == 2
    first = (base / "output" / "failure").read_text().splitlines()[0]
    assert first == (
        "Invalid hyperparameter or option: --hyp-mosaic: hyperparameter mosaic=7.0 is out of range [0.0, 1.0]"
    )
    assert not (base / "model").exists()


# run in a child process: importing the toolkit (boto3, botocore, ssl, ...) into the test process changed what
# a later in-process training's forked loader workers do on the DLC's versions (torch 2.5.1 from PyPI):
# tests/unit/test_runtime.py's 2-worker run died with SIGSEGV in our native library after this test and
# test_hostile_outputs_write.py, never in a fresh process; our training processes never import the toolkit
# (it starts them as programs of their own)
_TOOLKIT_ARGS = """
import json, sys
from sagemaker_training import environment
env = environment.Environment(
    resource_config={"current_host": "algo-1", "hosts": ["algo-1"], "network_interface_name": "eth0"},
    input_data_config={"training": {"TrainingInputMode": "File"}},
    hyperparameters=json.loads(sys.argv[1]),
)
print(json.dumps(env.to_cmd_args()))
"""


def test_the_real_toolkit_arguments_of_a_tuning_job_fold_and_parse():
    # hyperparameters.json of one training job of a tuning job, decoded as the toolkit does: the static ones,
    # one tuned value per range, and AMT's own `_tuning_objective_metric` / the SDK's `sagemaker_*` keys
    pytest.importorskip("sagemaker_training")
    hyperparameters = {
        "cfg": "yolov5s",
        "hyp-override": "mosaic=1.0",
        "hyp-lr0": 0.0123,
        "optimizer": "AdamW",
        "cos-lr": "True",
        "batch-size": 64,
        "_tuning_objective_metric": "val:mAP50-95",
        "sagemaker_estimator_class_name": "PyTorch",
    }
    proc = run_python(_TOOLKIT_ARGS, json.dumps(hyperparameters), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    args = json.loads(proc.stdout)
    assert args == [
        "--batch-size",
        "64",
        "--cfg",
        "yolov5s",
        "--cos-lr",
        "True",
        "--hyp-lr0",
        "0.0123",
        "--hyp-override",
        "mosaic=1.0",
        "--optimizer",
        "AdamW",
    ]
    config = parse_train_args(fold_hyp_options(args))
    assert config.hyp_overrides == {"mosaic": 1.0, "lr0": 0.0123}
    assert (config.optimizer, config.cos_lr, config.batch_size) == ("AdamW", True, 64)
