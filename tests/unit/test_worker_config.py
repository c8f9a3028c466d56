"""The TrainConfig the driver hands its workers: the same values back (JSON round trip), and a one-line
ConfigError for anything that is not what the driver wrote."""

import json

import pytest

from yolov5_smddp.config.train_config import TrainConfig, parse_train_args
from yolov5_smddp.config.worker_config import FORMAT, from_json, to_json, with_options
from yolov5_smddp.errors import ConfigError

ARGV = [
    "--epochs", "7", "--batch-size", "16", "--imgsz", "320", "--cfg", "yolov5n", "--data", "/d/data.yaml",
    "--freeze", "1", "--hyp-override", "lr0=0.02,mosaic=0.5", "--cache", "ram", "--amp", "bf16",
    "--optimizer", "AdamW", "--rect", "--cos-lr", "false", "--val-conf", "0.01", "--time", "1.5",
    "--mosaic-partners", "recent", "--run-name", "job-1",
]  # fmt: skip


def test_round_trip_gives_the_same_config_and_the_same_given_options():
    config = parse_train_args(ARGV)
    back = from_json(to_json(config), source="t")
    assert back == config and back.given == config.given
    assert back.to_dict() == config.to_dict()
    assert back.freeze == [0]  # `--freeze 1` is expanded once, not again on the way back
    assert back.hyp_overrides == {"lr0": 0.02, "mosaic": 0.5} and back.cache == "ram" and back.rect is True
    default = parse_train_args([])
    assert (
        from_json(to_json(default), source="t") == default
        and from_json(to_json(default), source="t").given == set()
    )


def test_the_json_is_one_line_of_every_option():
    text = to_json(parse_train_args(["--epochs", "2"]))
    document = json.loads(text)
    assert "\n" not in text and document["format"] == FORMAT and document["given"] == ["epochs"]
    assert document["options"] == TrainConfig(epochs=2).to_dict()


def test_with_options_sets_values_counts_them_given_and_checks_them():
    config = parse_train_args(["--epochs", "3", "--freeze", "2"])
    out = with_options(config, data="/x/data.yaml", model_dir="/m")
    assert (out.data, out.model_dir, out.epochs, out.freeze) == ("/x/data.yaml", "/m", 3, [0, 1])
    assert out.given == {"epochs", "freeze", "data", "model_dir"} and config.data is None
    with pytest.raises(ConfigError, match="--epochs"):
        with_options(config, epochs=0)
    with pytest.raises(TypeError, match="nonsense"):
        with_options(config, nonsense=1)


def _document(**changes):
    document = json.loads(to_json(parse_train_args(["--epochs", "2"])))
    for key, value in changes.items():
        if key in document:
            document[key] = value
        else:
            document["options"][key] = value
    return json.dumps(document)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "w.json: not a training config \\(bad JSON"),
        ("[1, 2]", "not a training config of format .* \\(found 'list'\\)"),
        (_document(format="yolov5-smddp-train-config/0"), "found 'yolov5-smddp-train-config/0'"),
        (_document(options=[]), "'options' must be an object"),
        (_document(given=["epochs", "nonsense"]), "'given' must list option names"),
        (_document(nonsense=1), "unknown: nonsense"),
        (_document(epochs="2"), "option 'epochs' has '2', not a value of type <class 'int'>"),
        (_document(epochs=True), "option 'epochs' has True"),
        (_document(rect=1), "option 'rect' has 1"),
        (_document(optimizer="adamw"), "option 'optimizer' has 'adamw'"),
        (_document(freeze=["1"]), "option 'freeze' has"),
        (_document(hyp_overrides={"lr0": "x"}), "option 'hyp_overrides' has"),
        (_document(epochs=0), "w.json: --epochs=0 must be >= 1"),  # TrainConfig's own check
    ],
)
def test_anything_else_is_one_config_error_naming_the_source(text, message):
    with pytest.raises(ConfigError, match=message) as caught:
        from_json(text, source="w.json")
    assert str(caught.value).startswith("w.json: ")
    assert "\n" not in str(caught.value)


def test_a_missing_option_is_named():
    document = json.loads(to_json(parse_train_args([])))
    del document["options"]["imgsz"]
    with pytest.raises(ConfigError, match="missing: imgsz; unknown: -"):
        from_json(json.dumps(document), source="w.json")
