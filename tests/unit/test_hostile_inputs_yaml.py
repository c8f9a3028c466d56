"""Hostile YAML files (issue 42): data.yaml, hyp files and model yamls are read by one bounded reader.
Every case ends in one error line naming the file and the bound; the corpus is generated here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from yolov5_smddp.config.hyp import load_hyp
from yolov5_smddp.data.config import load_data_config
from yolov5_smddp.errors import ConfigError, DataError
from yolov5_smddp.files.bounded_yaml import MAX_DEPTH, MAX_NODES, MAX_YAML_BYTES, load_yaml, parse_yaml
from yolov5_smddp.models.yolo import load_model_config


def _laughs(levels: int = 9, fan: int = 10) -> str:
    """A billion-laughs document: each level lists the previous one `fan` times (fan**levels nodes)."""
    lines = ["l0: &l0 [" + ", ".join(["lol"] * fan) + "]"]
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * fan) + "]")
    return "\n".join(lines) + f"\nnames: *l{levels - 1}\n"


CASES = {
    "deep_flow": (
        "names: " + "[" * 100_000 + "]" * 100_000,
        f"is nested deeper than {MAX_DEPTH} levels at line 1",
    ),
    "deep_block": (
        "\n".join(" " * i + f"k{i}:" for i in range(200)),
        f"is nested deeper than {MAX_DEPTH} levels at line {MAX_DEPTH}",
    ),
    "laughs": (_laughs(), f"expands to more than {MAX_NODES:,} nodes through its aliases (*name)"),
    "self_alias": (
        "names: &a [x, *a]\n",
        "has an alias that refers to a node containing it at line 1, column 8",
    ),
    "python_tag": (
        "lr0: !!python/object/apply:os.system ['touch /tmp/pwned']\n",
        "has the YAML tag 'tag:yaml.org,2002:python/object/apply:os.system' at line 1, column 6; "
        "tags are not allowed in a config",
    ),
    "custom_tag": ("lr0: !secret 1\n", "has the YAML tag '!secret' at line 1, column 6"),
    "int_70_bits": (
        f"lr0: {2**70}\n",
        "has an integer beyond 64 bits under the key 'lr0' at line 1, column 6 ('1180591620717411303424')",
    ),
    "syntax": (
        "names: [a, b\n",
        "not valid YAML: expected ',' or ']', but got '<stream end>' at line 2, column 1",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_parse_refuses_each_hostile_document_in_one_line(case):
    text, message = CASES[case]
    with pytest.raises(ConfigError) as caught:
        parse_yaml(text, "x.yaml", ConfigError)
    assert str(caught.value).startswith("x.yaml: ")
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_plain_documents_still_parse_as_yaml_1_1():
    assert parse_yaml("names: [a, NO, yes]\nnc: 3\nlr: 1e-3\n", "x", ConfigError) == {
        "names": ["a", False, True],
        "nc": 3,
        "lr": "1e-3",  # YAML 1.1: no dot, so a string (as before: PyYAML's safe loader)
    }
    shared = parse_yaml("a: &r [1, 2]\nb: *r\n", "x", ConfigError)
    assert shared == {"a": [1, 2], "b": [1, 2]}


def _file(tmp_path: Path, name: str, content: bytes | str) -> Path:
    path = tmp_path / name
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


def test_not_utf8_is_named_with_its_offset(tmp_path):
    path = _file(tmp_path, "hyp.yaml", b"lr0: 0.01\n# caf\xe9\n")
    with pytest.raises(
        ConfigError, match=r"hyp.yaml: not UTF-8 text \(byte 0xe9 at offset 15\); save it as UTF-8$"
    ):
        load_yaml(path, ConfigError)


def test_oversized_file_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "big.yaml"
    with open(path, "wb") as f:
        f.truncate(MAX_YAML_BYTES + 1)
    with pytest.raises(
        DataError, match=rf"big.yaml: a {MAX_YAML_BYTES + 1:,}-byte YAML file, over the limit of "
    ):
        load_yaml(path, DataError)


def test_fifo_and_device_are_never_opened(tmp_path):
    fifo = tmp_path / "data.yaml"
    os.mkfifo(fifo)  # opening it for reading would block: the child is killed by the timeout, the test fails
    code = (
        "import sys\nfrom yolov5_smddp.data.config import load_data_config\n"
        "try:\n    load_data_config(sys.argv[1])\n"
        "except Exception as exc:\n    print(f'{type(exc).__name__}: {exc}')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run(
        [sys.executable, "-c", code, str(fifo)], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.stdout.strip() == f"DataError: {fifo}: a FIFO (named pipe), not a regular file"
    zero = tmp_path / "zero.yaml"
    zero.symlink_to("/dev/zero")
    with pytest.raises(ConfigError, match=r"zero.yaml: a character device, not a regular file$"):
        load_hyp(str(zero))


def test_each_config_kind_goes_through_the_bounded_reader(tmp_path):
    deep = "nc: " + "[" * 100_000 + "]" * 100_000 + "\n"
    with pytest.raises(DataError, match=rf"data.yaml: is nested deeper than {MAX_DEPTH} levels"):
        load_data_config(_file(tmp_path, "data.yaml", deep))
    with pytest.raises(
        ConfigError, match=rf"^--hyp file .*hyp.yaml: is nested deeper than {MAX_DEPTH} levels"
    ):
        load_hyp(str(_file(tmp_path, "hyp.yaml", deep)))
    with pytest.raises(ConfigError, match=rf"model.yaml: is nested deeper than {MAX_DEPTH} levels"):
        load_model_config(_file(tmp_path, "model.yaml", deep))
    with pytest.raises(ConfigError, match=r"--hyp file .*: has the YAML tag"):
        load_hyp(str(_file(tmp_path, "tag.yaml", CASES["python_tag"][0])))
    with pytest.raises(DataError, match=r"laughs.yaml: expands to more than"):
        load_data_config(_file(tmp_path, "laughs.yaml", _laughs()))


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (
            "[NO, yes, off]",
            "entry 0 is the boolean False (YAML reads unquoted yes/no/on/off/true/false as booleans)",
        ),
        ("[disk, null, [x, y]]", "entry 1 is empty (null)"),
        (
            "[disk, box, [x, y]]",
            "entry 2 is a list ([",
        ),
        ("{0: disk, 1: ''}", "id 1 is an empty string"),
        ("{0: disk, 1: off}", "id 1 is the boolean False"),
    ],
)
def test_class_names_must_be_non_empty_strings(tmp_path, names, message):
    (tmp_path / "images").mkdir()
    path = _file(tmp_path, "data.yaml", f"path: .\ntrain: images\nval: images\nnames: {names}\n")
    with pytest.raises(DataError) as caught:
        load_data_config(path)
    text = str(caught.value)
    assert text.startswith(f"{path}: key 'names': ") and message in text
    assert text.endswith('class names must be non-empty strings: quote them, e.g. names: ["NO", "yes"]')


def test_quoted_and_numeric_names_are_kept(tmp_path):
    (tmp_path / "images").mkdir()
    path = _file(tmp_path, "data.yaml", "path: .\ntrain: images\nval: images\nnames: ['NO', \"yes\", 7]\n")
    assert load_data_config(path).names == ["NO", "yes", "7"]
