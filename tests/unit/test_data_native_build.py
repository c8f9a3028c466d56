"""setup.py builds the native library with the package: the file native.py looks for, only after finding
jpeglib.h, and an install without libjpeg-turbo's headers fails with one line naming the package to install
(or the opt-out), not a compiler error."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from native_part import installed_library
from setuptools import Distribution
from setuptools.errors import CompileError, PlatformError

from yolov5_smddp.data import native

REPO = Path(__file__).resolve().parent.parent.parent


def _load_setup():
    spec = importlib.util.spec_from_file_location("yolov5_smddp_setup", REPO / "setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # setup() runs only under __main__
    return module


setup_py = _load_setup()


def test_the_library_file_is_the_one_native_py_loads():
    [ext] = setup_py.native_extensions({})
    assert ext.name == setup_py.EXTENSION and ext.sources == [setup_py.SOURCE]
    assert ext.libraries == [] and "-Wl,--exclude-libs,ALL" in ext.extra_link_args  # libjpeg: static, hidden
    command = setup_py.BuildNative(Distribution())
    built = Path(command.get_ext_filename(ext.name))
    assert built == Path("yolov5_smddp/data") / native.LIBRARY_NAME
    assert (REPO / setup_py.SOURCE).is_file()


def test_the_opt_out_builds_nothing():
    assert setup_py.native_extensions({setup_py.OPT_OUT_ENV: "1"}) == []
    assert len(setup_py.native_extensions({setup_py.OPT_OUT_ENV: "0"})) == 1


def test_the_tarball_comes_from_the_named_source_or_upstream_then_the_apt_mirrors(tmp_path):
    apt = tmp_path / "apt"
    (apt / "sources.list.d").mkdir(parents=True)
    (apt / "sources.list").write_text(
        "# deb http://commented.example/x stable main\ndeb [arch=amd64] http://a.example/debian stable main\ndeb-src http://src.example/d stable main\n"
    )
    (apt / "sources.list.d" / "b.sources").write_text(
        "Types: deb\nURIs: https://b.example/ubuntu/\nSuites: jammy\n"
    )
    mirrors = setup_py.apt_mirrors((apt,))
    assert mirrors == ["http://a.example/debian", "https://b.example/ubuntu"]
    assert setup_py.tarball_sources({}, mirrors) == [
        setup_py.LIBJPEG_TURBO_URL,
        f"http://a.example/debian/{setup_py.MIRROR_PATH}",
        f"https://b.example/ubuntu/{setup_py.MIRROR_PATH}",
    ]
    assert setup_py.tarball_sources({setup_py.SOURCE_ENV: "/x/t.tar.gz"}, mirrors) == ["/x/t.tar.gz"]


def test_a_tarball_whose_hash_differs_is_refused_with_one_line(tmp_path):
    wrong = tmp_path / "libjpeg-turbo.tar.gz"
    wrong.write_bytes(b"not libjpeg-turbo")
    dest = tmp_path / "build" / "t.tar.gz"
    with pytest.raises(PlatformError) as caught:
        setup_py.fetch_tarball([str(wrong), str(tmp_path / "absent.tar.gz")], dest)
    said = str(caught.value)
    assert "\n" not in said and f"{wrong}: SHA-256 {hashlib.sha256(b'not libjpeg-turbo').hexdigest()}" in said
    assert "absent.tar.gz" in said and setup_py.SOURCE_ENV in said and not dest.exists()
    good = tmp_path / "good.tar.gz"
    good.write_bytes(b"pinned")
    assert (
        setup_py.fetch_tarball([str(wrong), str(good)], dest, hashlib.sha256(b"pinned").hexdigest()) == dest
    )
    assert dest.read_bytes() == b"pinned"


def _tarball(path: Path, *members: tuple[str, bytes | None, str]) -> Path:
    """A .tar.gz with (name, content, kind) members: kind "file" (content), "dir", "symlink" (to content)
    or "fifo"."""
    with tarfile.open(path, "w:gz") as tar:
        for name, content, kind in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                info.size, info.mode = len(content), 0o4755  # set-uid: must not survive
                tar.addfile(info, io.BytesIO(content))
                continue
            info.type = {"dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE, "fifo": tarfile.FIFOTYPE}[kind]
            info.linkname = (content or b"").decode()
            tar.addfile(info)
    return path


@pytest.mark.parametrize("has_data_filter", [True, False], ids=["python>=3.11.4", "python3.11.2"])
def test_the_tarball_is_extracted_with_plain_files_on_pythons_without_the_data_filter(
    tmp_path, monkeypatch, has_data_filter
):
    # Debian bookworm's Python 3.11.2 (the DLC-versions suite) has no tarfile.data_filter and no
    # extractall(filter=...): the build failed there with a TypeError before extract_plain
    if not has_data_filter:
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
        real = tarfile.TarFile.extractall

        def extractall_of_3_11_2(self, path=".", members=None, *, numeric_owner=False, **kwargs):
            assert not kwargs, f"Python 3.11.2's extractall takes no {sorted(kwargs)}"
            return real(self, path, members, numeric_owner=numeric_owner)

        monkeypatch.setattr(tarfile.TarFile, "extractall", extractall_of_3_11_2)
    good = _tarball(tmp_path / "good.tar.gz", ("top", None, "dir"), ("top/a.c", b"int a;", "file"))
    dest = tmp_path / "src"
    with tarfile.open(good) as tar:
        setup_py.extract_plain(tar, dest)
    assert (dest / "top" / "a.c").read_bytes() == b"int a;"
    assert (dest / "top" / "a.c").stat().st_mode & 0o7777 == 0o755  # executable kept, set-uid dropped


@pytest.mark.parametrize(
    ("member", "why"),
    [
        (("top/link", b"/etc/passwd", "symlink"), "a link"),
        (("top/pipe", None, "fifo"), "a special file"),
        (("../outside.c", b"x", "file"), "a path outside the folder"),
        (("/abs.c", b"x", "file"), "a path outside the folder"),
    ],
)
def test_a_tarball_member_that_is_not_a_plain_file_inside_is_refused_and_nothing_is_written(
    tmp_path, monkeypatch, member, why
):
    monkeypatch.delattr(tarfile, "data_filter", raising=False)  # our check, not tarfile's
    bad = _tarball(tmp_path / "bad.tar.gz", ("top", None, "dir"), ("top/a.c", b"int a;", "file"), member)
    dest = tmp_path / "src"
    dest.mkdir()
    with tarfile.open(bad) as tar, pytest.raises(CompileError) as caught:
        setup_py.extract_plain(tar, dest)
    assert f"refusing member {member[0]!r} ({why})" in str(caught.value)
    assert list(dest.iterdir()) == [] and not (tmp_path / "outside.c").exists()


def test_the_refusal_names_the_tools_and_the_opt_out():
    said = setup_py.missing_message(["cmake", "nasm"])
    assert "\n" not in said
    assert said.startswith(
        f"yolov5-smddp's native loader builds libjpeg-turbo {setup_py.LIBJPEG_TURBO_VERSION} and needs cmake, nasm"
    )
    for name in ("apt-get install gcc cmake nasm", "dnf install gcc cmake nasm", "YOLOV5_SMDDP_NO_NATIVE=1"):
        assert name in said
    assert setup_py.missing_tools(lambda tool: None if tool == "nasm" else "/usr/bin/" + tool) == ["nasm"]


_REFUSE = """
import importlib.util, sys
from pathlib import Path
out, = sys.argv[1:]
spec = importlib.util.spec_from_file_location("yolov5_smddp_setup", "setup.py")
setup_py = importlib.util.module_from_spec(spec)
spec.loader.exec_module(setup_py)
setup_py.missing_tools = lambda: ["cmake", "nasm"]
setup_py.main(["-q", "build_ext", "--build-lib", out, "--build-temp", out])
"""


def test_an_install_without_the_build_tools_fails_with_one_line(tmp_path):
    """The real setup() and build_ext without cmake and nasm: exit status 1, the refusal as the last line, no
    traceback, nothing compiled."""
    out = tmp_path / "build"
    proc = subprocess.run(
        [sys.executable, "-c", _REFUSE, str(out)],
        cwd=REPO,
        env={**os.environ, setup_py.OPT_OUT_ENV: ""},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "error: " + setup_py.missing_message(["cmake", "nasm"])
    assert not list(out.rglob("*.o")) and not list(out.rglob("*.so"))


_NO_LIBJPEG_MAPPED = """
import json
from yolov5_smddp.data import native
lib = native.library()
maps = [line.split()[-1] for line in open("/proc/self/maps") if "libjpeg" in line]
print(json.dumps({"why_not": native.why_not(), "libjpeg mapped": sorted(set(maps))}))
"""


def test_the_installed_library_carries_its_own_libjpeg(tmp_path):
    """Loaded alone, the library maps no libjpeg shared object: libjpeg-turbo is linked in, statically."""
    installed_library()
    proc = subprocess.run(
        [sys.executable, "-c", _NO_LIBJPEG_MAPPED],
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"why_not": "", "libjpeg mapped": []}
