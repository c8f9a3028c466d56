"""Builds the loader's native library (yolov5_smddp/data/native.c) with the package: `pip install .` compiles
it against the system's libjpeg-turbo into yolov5_smddp/data/libyolov5_smddp_native.so, which
yolov5_smddp/data/native.py loads with ctypes. Everything else about the package is in pyproject.toml.

A plain C library, not a CPython extension module: it has no Python API (ctypes passes numpy buffers), so
one build serves every Python version, and native.py can still load it in a link-map namespace of its own
(dlmopen) when pip's torchvision has already put an older libjpeg in the process, which an imported
extension module could not do.

No jpeglib.h on the build machine fails the install with one line naming the package to install, unless
YOLOV5_SMDDP_NO_NATIVE=1 asks for an install without the library (the loader then says so once per process
and decodes with OpenCV: the same pixels, slower).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CompileError, PlatformError

OPT_OUT_ENV = "YOLOV5_SMDDP_NO_NATIVE"
EXTENSION = "yolov5_smddp.data.libyolov5_smddp_native"  # native.py: LIBRARY_NAME is its file name + ".so"
SOURCE = "yolov5_smddp/data/native.c"
HEADER = "jpeglib.h"
INSTALL_HINT = (
    "install libjpeg-turbo's development files (Debian/Ubuntu: apt-get install libjpeg62-turbo-dev, "
    "or libjpeg-dev; RHEL/Fedora: dnf install libjpeg-turbo-devel), or set "
    f"{OPT_OUT_ENV}=1 to install without the native loader (OpenCV decodes instead: same pixels, slower)"
)


def opted_out(environ: dict[str, str]) -> bool:
    """True when the install asks for no native library (YOLOV5_SMDDP_NO_NATIVE=1)."""
    return environ.get(OPT_OUT_ENV, "").strip() == "1"


def default_include_dirs() -> list[Path]:
    """Where a C compiler looks for headers by default on this machine, the most specific first."""
    dirs = [Path(sys.prefix) / "include", Path("/usr/local/include")]
    multiarch = sysconfig.get_config_var("MULTIARCH")
    if multiarch:
        dirs.append(Path("/usr/include") / multiarch)
    return dirs + [Path("/usr/include")]


def pkg_config(flag: str) -> list[Path]:
    """The directories that `pkg-config FLAG libjpeg` names (-I or -L stripped); none without pkg-config or
    without a libjpeg.pc."""
    exe = shutil.which("pkg-config")
    if exe is None:
        return []
    proc = subprocess.run([exe, flag, "libjpeg"], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return []
    return [Path(word[2:]) for word in proc.stdout.split() if word[:2] in ("-I", "-L") and word[2:]]


def include_candidates(environ: dict[str, str]) -> list[Path]:
    """The directories searched for jpeglib.h: pkg-config's, then $CPATH and $C_INCLUDE_PATH (which the
    compiler reads too), then the default ones."""
    env_dirs = [
        Path(part)
        for name in ("CPATH", "C_INCLUDE_PATH")
        for part in environ.get(name, "").split(os.pathsep)
        if part
    ]
    return pkg_config("--cflags-only-I") + env_dirs + default_include_dirs()


def find_header(dirs: list[Path], header: str = HEADER) -> Path | None:
    """The first directory of `dirs` that holds `header`, or None."""
    return next((d for d in dirs if (d / header).is_file()), None)


def missing_message(dirs: list[Path]) -> str:
    """The one line an install without libjpeg-turbo's headers fails with."""
    searched = ", ".join(str(d) for d in dirs) or "no directories"
    return f"yolov5-smddp's native loader needs {HEADER} (libjpeg-turbo >= 1.5), not found in {searched}: {INSTALL_HINT}"


class BuildNative(build_ext):
    """build_ext for the one plain C library: its file is libyolov5_smddp_native.so (no Python ABI tag: it
    does not use Python), compiled only after jpeglib.h is found; a missing header or a failed compile is
    one clear line."""

    def get_ext_filename(self, fullname: str) -> str:
        parts = fullname.split(".")
        if parts[-1] == EXTENSION.rsplit(".", 1)[-1]:
            return os.path.join(*parts[:-1], parts[-1] + ".so")
        return super().get_ext_filename(fullname)

    def build_extension(self, ext: Extension) -> None:
        dirs = include_candidates(dict(os.environ))
        found = find_header(dirs)
        if found is None:
            raise PlatformError(missing_message(dirs))
        if found not in default_include_dirs():
            ext.include_dirs.append(str(found))
        ext.library_dirs.extend(str(d) for d in pkg_config("--libs-only-L"))
        try:
            super().build_extension(ext)
        except CompileError as exc:
            raise CompileError(
                f"{SOURCE} did not compile against {found / HEADER} ({exc}): it needs libjpeg-turbo >= 1.5 "
                f"(jpeg_skip_scanlines, JCS_EXT_BGR), not another libjpeg; {INSTALL_HINT}"
            ) from exc


def native_extensions(environ: dict[str, str]) -> list[Extension]:
    """The library to build: none when the install opted out."""
    if opted_out(environ):
        return []
    return [
        Extension(
            EXTENSION,
            sources=[SOURCE],
            libraries=["jpeg"],
            extra_compile_args=["-O2", "-Wall", "-Wextra"],
            py_limited_api=False,
        )
    ]


def main(script_args: list[str] | None = None) -> None:
    """setup() with the library (script_args: the command line; None: sys.argv)."""
    setup(
        ext_modules=native_extensions(dict(os.environ)),
        cmdclass={"build_ext": BuildNative},
        script_args=script_args,
    )


if __name__ == "__main__":
    main()
