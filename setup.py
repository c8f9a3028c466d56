"""Builds the loader's native library (yolov5_smddp/data/native.c) with the package: `pip install .` compiles
it into yolov5_smddp/data/libyolov5_smddp_native.so, which yolov5_smddp/data/native.py loads with ctypes.
Everything else about the package is in pyproject.toml.

One libc, one libjpeg per library: native.c links a static, position-independent libjpeg-turbo that this
file builds from the upstream source tarball (pinned by SHA-256; cmake and nasm from the system's packages),
its symbols hidden inside our library (--exclude-libs). Nothing is left for the dynamic linker to bind to
another libjpeg.so.62 (pip's torchvision bundles an older one without jpeg_skip_scanlines), so native.py
loads the library with a plain dlopen: no link-map namespace of its own, no second libc in the process (the
dlmopen fallback this replaces mapped one, and a forked loader worker in that state died with SIGSEGV).
Chosen over a private shared copy with its own SONAME (two files to ship, an rpath to keep right) and over
binding entry points by path (a second libc again).

The tarball: $YOLOV5_SMDDP_LIBJPEG_TURBO_SOURCE (a file or URL) if set, else upstream's release, else the
same file from the Debian/Ubuntu mirrors the machine's apt sources name (their orig tarball is upstream's,
byte for byte); every one is checked against LIBJPEG_TURBO_SHA256. A missing tool, a tarball that cannot
be had or whose hash differs fails the install with one line, unless YOLOV5_SMDDP_NO_NATIVE=1 asks for an
install without the library (the loader then says so once per process and decodes with OpenCV: the same
pixels, slower).

A plain C library, not a CPython extension module: it has no Python API (ctypes passes numpy buffers), so
one build serves every Python version.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tarfile
import urllib.request
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CompileError, PlatformError

OPT_OUT_ENV = "YOLOV5_SMDDP_NO_NATIVE"
SOURCE_ENV = "YOLOV5_SMDDP_LIBJPEG_TURBO_SOURCE"
EXTENSION = "yolov5_smddp.data.libyolov5_smddp_native"  # native.py: LIBRARY_NAME is its file name + ".so"
SOURCE = "yolov5_smddp/data/native.c"
LIBJPEG_TURBO_VERSION = "2.1.5"
LIBJPEG_TURBO_SHA256 = "254f3642b04e309fee775123133c6464181addc150499561020312ec61c1bf7c"
LIBJPEG_TURBO_URL = (
    "https://github.com/libjpeg-turbo/libjpeg-turbo/releases/download/"
    f"{LIBJPEG_TURBO_VERSION}/libjpeg-turbo-{LIBJPEG_TURBO_VERSION}.tar.gz"
)
MIRROR_PATH = f"pool/main/libj/libjpeg-turbo/libjpeg-turbo_{LIBJPEG_TURBO_VERSION}.orig.tar.gz"
TOOLS = ("cmake", "nasm")
INSTALL_HINT = (
    "install a C compiler, cmake and nasm (Debian/Ubuntu: apt-get install gcc cmake nasm; RHEL/Fedora: "
    f"dnf install gcc cmake nasm), or set {OPT_OUT_ENV}=1 to install without the native loader (OpenCV "
    "decodes instead: same pixels, slower)"
)


def opted_out(environ: dict[str, str]) -> bool:
    """True when the install asks for no native library (YOLOV5_SMDDP_NO_NATIVE=1)."""
    return environ.get(OPT_OUT_ENV, "").strip() == "1"


def missing_tools(which=shutil.which) -> list[str]:
    """The build tools of the static libjpeg-turbo that are not on PATH."""
    return [tool for tool in TOOLS if which(tool) is None]


def missing_message(tools: list[str]) -> str:
    """The one line an install without the build tools fails with."""
    return f"yolov5-smddp's native loader builds libjpeg-turbo {LIBJPEG_TURBO_VERSION} and needs {', '.join(tools)}, not found on PATH: {INSTALL_HINT}"


def apt_mirrors(roots: tuple[Path, ...] = (Path("/etc/apt"),)) -> list[str]:
    """The http(s) archive URIs that the machine's apt sources name (one-line and deb822 files), in order."""
    found: list[str] = []
    for root in roots:
        files = [root / "sources.list", *sorted((root / "sources.list.d").glob("*.list"))]
        files += sorted((root / "sources.list.d").glob("*.sources"))
        for file in files:
            try:
                text = file.read_text(errors="replace")
            except OSError:
                continue
            for line in text.splitlines():
                words = line.split("#", 1)[0].split()
                if words and words[0] in ("deb", "URIs:"):
                    found += [w for w in words[1:] if re.match(r"^https?://", w)]
    return list(dict.fromkeys(uri.rstrip("/") for uri in found))


def tarball_sources(environ: dict[str, str], mirrors: list[str]) -> list[str]:
    """Where the tarball is looked for, in order: $YOLOV5_SMDDP_LIBJPEG_TURBO_SOURCE alone when set, else
    upstream's release, then each apt mirror's copy."""
    named = environ.get(SOURCE_ENV, "").strip()
    if named:
        return [named]
    return [LIBJPEG_TURBO_URL, *(f"{m}/{MIRROR_PATH}" for m in mirrors)]


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_tarball(sources: list[str], dest: Path, expected: str = LIBJPEG_TURBO_SHA256) -> Path:
    """The first source whose bytes hash to `expected`, copied to `dest` (kept: a rebuild reuses it); one
    line naming every source and why each failed otherwise."""
    if dest.is_file() and sha256_of(dest) == expected:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    failures = []
    for source in sources:
        part = dest.with_suffix(".part")
        try:
            if re.match(r"^https?://", source):
                with urllib.request.urlopen(source, timeout=60) as response, part.open("wb") as out:
                    shutil.copyfileobj(response, out)
            else:
                shutil.copyfile(source, part)
        except OSError as exc:
            failures.append(f"{source}: {exc}")
            continue
        got = sha256_of(part)
        if got != expected:
            failures.append(f"{source}: SHA-256 {got}, expected {expected}")
            part.unlink()
            continue
        part.replace(dest)
        return dest
    raise PlatformError(
        f"libjpeg-turbo {LIBJPEG_TURBO_VERSION}'s source tarball could not be had ({'; '.join(failures)}): "
        f"set {SOURCE_ENV} to a copy of libjpeg-turbo-{LIBJPEG_TURBO_VERSION}.tar.gz, or {OPT_OUT_ENV}=1"
    )


def extract_plain(tar: tarfile.TarFile, dest: Path) -> None:
    """Extracts `tar` under `dest`, refusing any member that is not a plain file or folder inside it (an
    absolute or `..` path, a link, a device). tarfile's own "data" filter does that from Python 3.11.4 /
    3.10.12 on; the DLC-versions suite's Python (Debian bookworm's 3.11.2) predates it, so the check is ours
    on every version."""
    members = tar.getmembers()
    for member in members:
        if member.issym() or member.islnk():
            why = "a link"
        elif not (member.isfile() or member.isdir()):
            why = "a special file"
        elif member.name.startswith(("/", "\\")) or ".." in Path(member.name).parts:
            why = "a path outside the folder"
        else:
            continue
        raise CompileError(f"{tar.name}: refusing member {member.name!r} ({why})")
    for member in members:  # no owner, no set-id bits: the files are ours, readable and ours to remove
        member.uid = member.gid = 0
        member.uname = member.gname = ""
        member.mode = 0o755 if member.isdir() or member.mode & 0o100 else 0o644
    if hasattr(tarfile, "data_filter"):  # and tarfile's own check where it has one (no warning on 3.12+)
        tar.extractall(dest, members=members, filter="data")
    else:
        tar.extractall(dest, members=members)


def build_static_libjpeg(tarball: Path, work: Path) -> tuple[Path, Path]:
    """libjpeg-turbo built from `tarball` as a static, position-independent library (SIMD required on
    x86-64) and installed under work/prefix; returns (its include folder, its libjpeg.a). Kept: a rebuild
    with the same tarball reuses it."""
    prefix = work / "prefix"
    built = sorted(prefix.glob("lib*/libjpeg.a"))  # lib or lib64, as GNUInstallDirs decides
    if built and (prefix / "include" / "jpeglib.h").is_file():
        return prefix / "include", built[0]
    src = work / "src"
    if src.exists():
        shutil.rmtree(src)
    src.mkdir(parents=True)
    with tarfile.open(tarball) as tar:
        extract_plain(tar, src)
    [top] = [p for p in src.iterdir() if p.is_dir()]
    build = work / "build"
    flags = [
        "-DENABLE_SHARED=OFF",
        "-DENABLE_STATIC=ON",
        "-DWITH_TURBOJPEG=OFF",
        "-DCMAKE_POSITION_INDEPENDENT_CODE=ON",
        "-DCMAKE_BUILD_TYPE=Release",
        f"-DCMAKE_INSTALL_PREFIX={prefix}",
    ]
    if os.uname().machine in ("x86_64", "AMD64", "aarch64"):
        flags.append("-DREQUIRE_SIMD=ON")
    jobs = str(max(1, min(8, os.cpu_count() or 1)))
    for command in (
        ["cmake", "-S", str(top), "-B", str(build), *flags],
        ["cmake", "--build", str(build), "--parallel", jobs],
        ["cmake", "--install", str(build)],
    ):
        proc = subprocess.run(command, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            tail = " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-5:])
            raise CompileError(
                f"building libjpeg-turbo {LIBJPEG_TURBO_VERSION} failed at `{' '.join(command[:3])}`: {tail}"
            )
    [library] = sorted(prefix.glob("lib*/libjpeg.a"))
    return prefix / "include", library


class BuildNative(build_ext):
    """build_ext for the one plain C library: its file is libyolov5_smddp_native.so (no Python ABI tag: it
    does not use Python), linked with the static libjpeg-turbo built first; a missing tool, tarball or a
    failed compile is one clear line."""

    def get_ext_filename(self, fullname: str) -> str:
        parts = fullname.split(".")
        if parts[-1] == EXTENSION.rsplit(".", 1)[-1]:
            return os.path.join(*parts[:-1], parts[-1] + ".so")
        return super().get_ext_filename(fullname)

    def build_extension(self, ext: Extension) -> None:
        tools = missing_tools()
        if tools:
            raise PlatformError(missing_message(tools))
        work = Path(self.build_temp).resolve() / f"libjpeg-turbo-{LIBJPEG_TURBO_VERSION}"
        tarball = fetch_tarball(
            tarball_sources(dict(os.environ), apt_mirrors()),
            work / f"libjpeg-turbo-{LIBJPEG_TURBO_VERSION}.tar.gz",
        )
        include, library = build_static_libjpeg(tarball, work)
        ext.include_dirs.append(str(include))
        ext.extra_objects.append(str(library))
        try:
            super().build_extension(ext)
        except CompileError as exc:
            raise CompileError(
                f"{SOURCE} did not compile against libjpeg-turbo {LIBJPEG_TURBO_VERSION} ({exc}): {INSTALL_HINT}"
            ) from exc


def native_extensions(environ: dict[str, str]) -> list[Extension]:
    """The library to build: none when the install opted out."""
    if opted_out(environ):
        return []
    return [
        Extension(
            EXTENSION,
            sources=[SOURCE],
            extra_compile_args=["-O2", "-Wall", "-Wextra"],
            # the static libjpeg's symbols stay inside our library: nothing binds to them, nor ours elsewhere
            extra_link_args=["-Wl,--exclude-libs,ALL", "-Wl,-Bsymbolic"],
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
