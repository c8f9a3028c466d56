"""Bounded reads reserve nothing (issue 50 item 6): a small file under a 4 GiB limit reads where address
space is capped, the limit still holds, and a hyp YAML integer beyond 64 bits names its key."""

from __future__ import annotations

import pytest
from child_python import run_python

from yolov5_smddp.errors import ConfigError
from yolov5_smddp.files.bounded_read import CHUNK_BYTES, UnreadableFile, read_limited
from yolov5_smddp.files.bounded_yaml import parse_yaml

_CAPPED_READ = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))  # 1 GiB of address space, as under ulimit -v
from yolov5_smddp.files.bounded_read import read_limited
print(len(read_limited(sys.argv[1], 4 << 30, what="JSON file")))
"""


def test_a_1kb_file_under_a_4gib_limit_reads_with_1gib_of_address_space(tmp_path):
    path = tmp_path / "instances.json"
    path.write_bytes(b"{}" + b" " * 1022)
    done = run_python(_CAPPED_READ, path, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (0, "1024"), done.stderr[-2000:]


@pytest.mark.parametrize("size", [0, 1, CHUNK_BYTES - 1, CHUNK_BYTES, CHUNK_BYTES + 1, 3 * CHUNK_BYTES + 7])
def test_chunked_reads_return_the_whole_file(tmp_path, size):
    path = tmp_path / "f.bin"
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    path.write_bytes(data)
    assert read_limited(path, 4 << 30) == data


def test_the_limit_still_holds_across_chunks(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * (CHUNK_BYTES + 10))
    assert len(read_limited(path, CHUNK_BYTES + 10)) == CHUNK_BYTES + 10
    with pytest.raises(UnreadableFile, match=r"over the limit of 1,048,585 bytes"):
        read_limited(path, CHUNK_BYTES + 9)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        (f"lr0: {2**70}\n", "lr0"),
        (f"anchors:\n  - [10, 13]\n  - [16, {2**64}]\n", "anchors[1][1]"),
        (f"outer:\n  inner: {-(2**63)}\n", "outer.inner"),
    ],
)
def test_a_hyp_integer_beyond_64_bits_names_its_key(text, key):
    with pytest.raises(ConfigError) as caught:
        parse_yaml(text, "hyp.yaml", ConfigError)
    assert f"has an integer beyond 64 bits under the key '{key}' at line" in str(caught.value)
