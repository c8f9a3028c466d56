"""Model configs and options bounded before anything is built or allocated (issue 42, item 4): each hostile
value is one ConfigError naming the key, the layer and the limit; through the CLI one `error:` line."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from yolov5_smddp.cli import main
from yolov5_smddp.config.hyp import load_hyp
from yolov5_smddp.config.train_config import parse_train_args
from yolov5_smddp.errors import ConfigError
from yolov5_smddp.models.yolo import build_model, load_model_config, resolve_layers
from yolov5_smddp.train.optim_recipe import check_freeze

TOO_BIG = 10**9
PARAMETERS = "(check depth_multiple, width_multiple, the repeats, channels, anchors and nc)"


def _config(**changes) -> dict:
    config = copy.deepcopy(load_model_config("yolov5n"))
    config.update(changes)
    config["name"] = "bomb.yaml"
    return config


def _row(config: dict, index: int) -> list:
    return (config["backbone"] + config["head"])[index]


def _set_arg(index: int, position: int, value) -> dict:
    config = _config()
    _row(config, index)[3][position] = value
    return config


def _set_number(index: int, value) -> dict:
    config = _config()
    _row(config, index)[1] = value
    return config


CASES = {
    "depth_multiple": (
        _config(depth_multiple=1e9),
        "bomb.yaml: depth_multiple must be a number in (0, 8], got 1000000000.0",
    ),
    "width_multiple": (
        _config(width_multiple=1e9),
        "bomb.yaml: width_multiple must be a number in (0, 8], got 1000000000.0",
    ),
    "repeats": (
        _set_number(2, TOO_BIG),
        "layer 2 (C3) in bomb.yaml: number (repeats) must be an integer in [1, 64], got 1000000000",
    ),
    "channels": (
        _set_arg(0, 0, TOO_BIG),
        "layer 0 (Conv) in bomb.yaml: channels 1000000000 is over the limit of 16384",
    ),
    "anchors per level": (
        _config(anchors=TOO_BIG),
        "bomb.yaml: anchors 1000000000 per level is over the limit of 32",
    ),
    "anchor pixels": (
        _config(anchors=[[1e9, 13, 16, 30, 33, 23]] * 3),
        "bomb.yaml: anchors: 1000000000.0 px is over the limit of 16384 px",
    ),
    "nc": (_config(nc=TOO_BIG), "bomb.yaml: nc 1000000000 is over the limit of 100,000"),
    "kernel": (
        _set_arg(1, 1, 10**6),
        f"layer 1 (Conv) in bomb.yaml: 512,000,000,001,824 parameters up to this layer, over the limit of "
        f"1,000,000,000 {PARAMETERS}",
    ),
    "width 8": (
        _config(width_multiple=8.0),
        f"layer 9 (SPPF) in bomb.yaml: 1,064,528,896 parameters up to this layer, over the limit of "
        f"1,000,000,000 {PARAMETERS}",
    ),
    "layers": (
        _config(backbone=[[-1, 1, "Conv", [16, 3, 1]]] * 600),
        "bomb.yaml: 615 layers in backbone and head, over the limit of 512",
    ),
}
CASES["repeats x depth"] = (
    {**_set_number(2, 64), "depth_multiple": 2.0},
    "layer 2 (C3) in bomb.yaml: number 64 x depth_multiple 2.0 = 128 repeats, over the limit of 64",
)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_hostile_model_config_is_refused_naming_the_key_and_layer(case):
    config, message = CASES[case]
    with pytest.raises(ConfigError) as caught:
        build_model(config)
    assert str(caught.value) == message
    with pytest.raises(ConfigError):
        resolve_layers(config)


def test_the_largest_release_configs_still_build():
    assert len(resolve_layers("yolov5x6")) == 34
    build_model(_config(width_multiple=1.25, depth_multiple=1.33))


def test_model_bombs_stay_small_in_memory(tmp_path):
    """Every bomb, in a fresh process: refused, and the peak RSS rises less than 150 MB over the process's
    peak with torch and the model code imported (torch 2.15's import alone peaks at ~530 MB); before the
    bounds, `channels: 1e9` tried a 108 GB allocation. VmHWM, not ru_maxrss: the latter carries the forking
    pytest's peak over the exec."""
    configs = tmp_path / "configs.json"
    configs.write_text(json.dumps([CASES[c][0] for c in sorted(CASES)]))
    script = (
        "import json, sys\n"
        "from yolov5_smddp.errors import ConfigError\n"
        "from yolov5_smddp.models.yolo import build_model\n"
        "def peak_kb():\n"
        "    return int(next(line for line in open('/proc/self/status') if line.startswith('VmHWM:')).split()[1])\n"
        "baseline = peak_kb()\n"
        "refused = 0\n"
        "for config in json.load(open(sys.argv[1])):\n"
        "    try:\n"
        "        build_model(config)\n"
        "    except ConfigError:\n"
        "        refused += 1\n"
        "print(refused, (peak_kb() - baseline) // 1024)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(configs)], capture_output=True, text=True, timeout=300, check=True
    )
    refused, rise_mb = map(int, done.stdout.split())
    assert refused == len(CASES)
    assert rise_mb < 150, rise_mb


def test_info_on_a_bomb_yaml_is_one_error_line(tmp_path, capsys):
    path = tmp_path / "bomb.yaml"
    config = _set_arg(0, 0, TOO_BIG)
    del config["name"]
    path.write_text(yaml.safe_dump(config))
    assert main(["info", "--cfg", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: layer 0 (Conv) in {path}: channels 1000000000 is over the limit of 16384\n"


# --- options ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--imgsz", "1048576"], "--imgsz=1048576 is over the limit of 8192"),
        (["--seed", "-1"], "--seed=-1 must be in 0..4294967295"),
        (["--seed", str(2**70)], "--seed=1180591620717411303424 must be in 0..4294967295"),
        (
            ["--hyp-override", "lr0=" + "1" * 400],
            "--hyp-override: hyperparameter lr0=inf is out of range [1e-08, 1.0]",
        ),
    ],
)
def test_options_are_bounded(argv, message):
    with pytest.raises(ConfigError) as caught:
        parse_train_args(argv)
    assert str(caught.value) == message


def test_the_largest_allowed_values_pass():
    config = parse_train_args(["--imgsz", "8192", "--seed", str(2**32 - 1)])
    assert (config.imgsz, config.seed) == (8192, 2**32 - 1)


def test_a_hyp_file_with_a_400_digit_integer_is_one_line(tmp_path):
    path = tmp_path / "hyp.yaml"
    path.write_text("lr0: " + "1" * 400 + "\n")
    with pytest.raises(ConfigError) as caught:
        load_hyp(str(path))
    assert str(caught.value) == (
        f"--hyp file {path}: has an integer beyond 64 bits under the key 'lr0' at line 1, column 6 ('{'1' * 40}')"
    )


def test_a_json_override_beyond_float_is_one_line():
    with pytest.raises(
        ConfigError, match=r"^invalid training option: .* \('int too large to convert to float'\)$"
    ):
        parse_train_args(["--hyp-override", '{"lr0": ' + "1" * 400 + "}"])


@pytest.mark.parametrize(
    ("freeze", "message"),
    [
        (list(range(1000)), "--freeze: layer 999 does not exist: yolov5n.yaml has 25 layers (0..24)"),
        (
            list(range(25)),
            "--freeze: layer 24 is the Detect head of yolov5n.yaml; with it frozen nothing learns the "
            "classes (freeze at most the first 24 layers)",
        ),
    ],
)
def test_freeze_against_the_models_layers(freeze, message):
    with pytest.raises(ConfigError) as caught:
        check_freeze(freeze, 25, "yolov5n.yaml")
    assert str(caught.value) == message
    check_freeze(list(range(24)), 25, "yolov5n.yaml")
    check_freeze([], 25, "yolov5n.yaml")


def test_train_with_freeze_1000_is_one_error_line(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("SAGEMAKER_BASE_DIR", raising=False)
    argv = [
        "train",
        "--epochs",
        "1",
        "--imgsz",
        "64",
        "--workers",
        "0",
        "--cfg",
        "yolov5n",
        "--freeze",
        "1000",
    ]
    argv += ["--noautoanchor", "--cache-dir", str(tmp_path / "cache"), "--model-dir", str(tmp_path / "m")]
    argv += ["--checkpoint-dir", str(tmp_path / "ck"), "--output-dir", str(tmp_path / "out")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == "error: --freeze: layer 999 does not exist: yolov5n.yaml has 25 layers (0..24)\n"
    assert not Path(tmp_path / "m" / "best.pt").exists()
