"""Obtain a pinned ``llama-server`` binary, built from source, cached outside the work tree.

llama.cpp publishes no binary that installs from a package registry, but the PyPI source
distribution of ``llama-cpp-python`` vendors llama.cpp's whole source tree, server
included, under ``vendor/llama.cpp``. This script downloads that sdist at a pinned
version with pip, configures it with CMake for a portable CPU build of the server only,
builds the ``llama-server`` target with every core, and keeps the result in

    ${HOTSEAT_LLAMA_CACHE:-~/.cache/hotseat}/llama-server-<version>/bin/llama-server

next to a ``build-info.json`` (version, flags, build seconds). A second run finds the
binary, checks that it starts, and returns in well under a second.

Usage::

    python scripts/llama/build_server.py            # build or reuse; prints the binary path
    python scripts/llama/build_server.py --print    # only print where it would be
    python scripts/llama/build_server.py --force    # rebuild even when cached
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
"""The pinned ``llama-cpp-python`` sdist whose vendored llama.cpp we build."""

CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=OFF",  # no -march=native: ggml's baseline for the arch (AVX2 on x86-64)
    "-DBUILD_SHARED_LIBS=OFF",  # one self-contained binary
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_CURL=OFF",  # no model downloads: members load local files
    "-DLLAMA_USE_PREBUILT_UI=OFF",  # otherwise the build tries to download a web UI
    "-DLLAMA_BUILD_UI=OFF",
)
TARGET = "llama-server"


def cache_root() -> Path:
    """``$HOTSEAT_LLAMA_CACHE``, else ``~/.cache/hotseat``."""
    return Path(os.environ.get("HOTSEAT_LLAMA_CACHE") or Path.home() / ".cache" / "hotseat")


def server_dir(version: str = LLAMA_CPP_PYTHON_VERSION) -> Path:
    return cache_root().expanduser() / f"llama-server-{version}"


def binary_path(version: str = LLAMA_CPP_PYTHON_VERSION) -> Path:
    return server_dir(version) / "bin" / TARGET


def _say(message: str) -> None:
    print(f"[llama-server] {message}", file=sys.stderr, flush=True)


def _runs(binary: Path) -> bool:
    """The binary exists and answers ``--version`` (a half-written file does not)."""
    if not binary.is_file() or not os.access(binary, os.X_OK):
        return False
    try:
        done = subprocess.run(
            [str(binary), "--version"], capture_output=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


@contextlib.contextmanager
def _lock(directory: Path) -> Iterator[None]:
    """One build at a time per version, across processes (a second caller waits)."""
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / ".lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _cmake() -> str:
    """CMake next to this interpreter (the ``cmake`` wheel of the dev extra), else on PATH."""
    local = Path(sys.executable).parent / "cmake"
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    found = shutil.which("cmake")
    if found is None:
        raise SystemExit(
            "cmake not found: install the dev extra (pip install -e '.[dev]') or cmake itself"
        )
    return found


def _check_compiler() -> None:
    if not (os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")):
        raise SystemExit("no C++ compiler found (install g++ or set CXX)")


def _download_sdist(version: str, into: Path) -> Path:
    _say(f"downloading llama-cpp-python=={version} (source distribution)")
    # Only this package from source: its build dependencies (pip prepares its metadata)
    # come as wheels, rather than compiling the whole build chain first.
    package = f"llama-cpp-python=={version}"
    pip = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
    subprocess.run([*pip, "--no-binary", "llama-cpp-python", package, "-d", str(into)], check=True)
    found = sorted(into.glob("llama_cpp_python-*.tar.gz"))
    if not found:
        raise SystemExit(f"pip download left no sdist in {into}")
    return found[0]


def _extract(sdist: Path, into: Path) -> Path:
    _say(f"extracting {sdist.name}")
    with tarfile.open(sdist) as archive:
        archive.extractall(into, filter="data")
    roots = [p for p in into.iterdir() if p.is_dir()]
    source = roots[0] / "vendor" / "llama.cpp"
    if not (source / "CMakeLists.txt").is_file():
        raise SystemExit(f"{sdist.name} has no vendor/llama.cpp/CMakeLists.txt")
    return source


def build(version: str, jobs: int) -> Path:
    """Build ``llama-server`` into the cache and return its path."""
    _check_compiler()
    cmake = _cmake()
    target_dir = server_dir(version)
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="build-", dir=target_dir) as tmp:
        work = Path(tmp)
        source = _extract(_download_sdist(version, work / "dl"), work / "src")
        build_dir = work / "build"
        _say(f"configuring with {cmake}")
        subprocess.run(
            [cmake, "-S", str(source), "-B", str(build_dir), *CMAKE_FLAGS],
            check=True,
            stdout=sys.stderr,
        )
        _say(f"building target {TARGET} with {jobs} jobs (several minutes on 2 cores)")
        subprocess.run(
            [cmake, "--build", str(build_dir), "--target", TARGET, "-j", str(jobs)],
            check=True,
            stdout=sys.stderr,
        )
        built = next(build_dir.rglob(TARGET), None)
        if built is None or not built.is_file():
            raise SystemExit(f"the build produced no {TARGET} under {build_dir}")
        final = binary_path(version)
        final.parent.mkdir(parents=True, exist_ok=True)
        staging = final.with_name(TARGET + ".partial")
        shutil.copy2(built, staging)
        staging.replace(final)  # atomic: a reader never sees a half-copied binary
    seconds = round(time.monotonic() - began, 1)
    info = {
        "llama_cpp_python": version,
        "cmake_flags": list(CMAKE_FLAGS),
        "jobs": jobs,
        "build_seconds": seconds,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    (target_dir / "build-info.json").write_text(json.dumps(info, indent=2) + "\n")
    _say(f"built {final} in {seconds}s")
    return final


def ensure(version: str = LLAMA_CPP_PYTHON_VERSION, *, jobs: int | None = None,
           force: bool = False) -> Path:  # fmt: skip
    """The cached binary, building it first when it is missing (or ``force``)."""
    binary = binary_path(version)
    if not force and _runs(binary):
        return binary
    with _lock(server_dir(version)):
        if not force and _runs(binary):  # built by another caller while we waited
            return binary
        return build(version, jobs or os.cpu_count() or 2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", default=LLAMA_CPP_PYTHON_VERSION,
                        help="llama-cpp-python sdist version (default: %(default)s)")  # fmt: skip
    parser.add_argument("--jobs", "-j", type=int, default=None, help="build jobs (default: cores)")
    parser.add_argument("--force", action="store_true", help="rebuild even when cached")
    parser.add_argument("--print", action="store_true", help="print the path, build nothing")
    args = parser.parse_args(argv)
    if args.print:
        print(binary_path(args.version))
        return 0
    try:
        print(ensure(args.version, jobs=args.jobs, force=args.force))
    except subprocess.CalledProcessError as exc:
        _say(f"failed: {' '.join(map(str, exc.cmd))} exited with {exc.returncode}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
