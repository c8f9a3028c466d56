"""setup.py builds the native library with the package: the file native.py looks for, only after finding
jpeglib.h, and an install without libjpeg-turbo's headers fails with one line naming the package to install
(or the opt-out), not a compiler error."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from setuptools import Distribution

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
    assert ext.name == setup_py.EXTENSION and ext.sources == [setup_py.SOURCE] and ext.libraries == ["jpeg"]
    command = setup_py.BuildNative(Distribution())
    built = Path(command.get_ext_filename(ext.name))
    assert built == Path("yolov5_smddp/data") / native.LIBRARY_NAME
    assert (REPO / setup_py.SOURCE).is_file()


def test_the_opt_out_builds_nothing():
    assert setup_py.native_extensions({setup_py.OPT_OUT_ENV: "1"}) == []
    assert len(setup_py.native_extensions({setup_py.OPT_OUT_ENV: "0"})) == 1


def test_find_header(tmp_path):
    empty, full = tmp_path / "empty", tmp_path / "full"
    empty.mkdir()
    full.mkdir()
    (full / "jpeglib.h").write_text("/* */\n")
    assert setup_py.find_header([]) is None
    assert setup_py.find_header([empty]) is None
    assert setup_py.find_header([empty, full]) == full
    assert setup_py.find_header([tmp_path / "absent", full, empty]) == full


def test_candidates_include_the_compilers_variables(monkeypatch, tmp_path):
    monkeypatch.setattr(setup_py, "pkg_config", lambda flag: [tmp_path / "pc"])
    dirs = setup_py.include_candidates(
        {"CPATH": f"{tmp_path / 'c1'}:{tmp_path / 'c2'}", "C_INCLUDE_PATH": ""}
    )
    assert dirs[:3] == [tmp_path / "pc", tmp_path / "c1", tmp_path / "c2"]
    assert dirs[-1] == Path("/usr/include")


def test_the_refusal_names_the_packages_and_the_opt_out(tmp_path):
    said = setup_py.missing_message([tmp_path])
    assert "\n" not in said
    assert said.startswith(
        f"yolov5-smddp's native loader needs jpeglib.h (libjpeg-turbo >= 1.5), not found in {tmp_path}:"
    )
    for name in ("libjpeg62-turbo-dev", "libjpeg-turbo-devel", "YOLOV5_SMDDP_NO_NATIVE=1"):
        assert name in said


_REFUSE = """
import importlib.util, sys
from pathlib import Path
out, empty = sys.argv[1:]
spec = importlib.util.spec_from_file_location("yolov5_smddp_setup", "setup.py")
setup_py = importlib.util.module_from_spec(spec)
spec.loader.exec_module(setup_py)
setup_py.include_candidates = lambda environ: [Path(empty)]
setup_py.main(["-q", "build_ext", "--build-lib", out, "--build-temp", out])
"""


def _refused_build(out, include_dir) -> subprocess.CompletedProcess:
    """The real setup() with the header search pointed at `include_dir`: it must exit 1 without a traceback."""
    proc = subprocess.run(
        [sys.executable, "-c", _REFUSE, str(out), str(include_dir)],
        cwd=REPO,
        env={**os.environ, setup_py.OPT_OUT_ENV: ""},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc


def test_an_install_without_the_headers_fails_with_one_line(tmp_path):
    """The real setup() and build_ext, with the header search pointed at an empty folder: exit status 1,
    the refusal as the last line, no traceback, nothing compiled."""
    empty, out = tmp_path / "empty", tmp_path / "build"
    empty.mkdir()
    proc = _refused_build(out, empty)
    assert proc.stderr.strip().splitlines()[-1] == "error: " + setup_py.missing_message([empty])
    assert not list(out.rglob("*.o")) and not list(out.rglob("*.so"))


def test_a_libjpeg_that_does_not_compile_fails_with_one_line(tmp_path):
    """A jpeglib.h that is not libjpeg-turbo's (here one that stops the compiler): the compile fails and the
    last line says what the library needs and how to get it or opt out."""
    other, out = tmp_path / "other", tmp_path / "build"
    other.mkdir()
    (other / "jpeglib.h").write_text('#error "not libjpeg-turbo"\n')
    proc = _refused_build(out, other)
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {setup_py.SOURCE} did not compile against {other / 'jpeglib.h'} (")
    assert last.endswith(setup_py.INSTALL_HINT) and "libjpeg-turbo >= 1.5" in last
    assert not list(out.rglob("*.so"))
