"""Everything a real llama.cpp pool needs here: the pinned ``llama-server`` and tiny models.

Builds (or reuses) the cached binary (``build_server.py``) and writes the generated models
(``tiny_gguf.py``) under the same cache root, then prints where they are. Both are keyed
by version, so a second run only checks that they are there (well under a second).

Layout, under ``${HOTSEAT_LLAMA_CACHE:-~/.cache/hotseat}``::

    llama-server-<llama-cpp-python version>/bin/llama-server
    llama-server-<llama-cpp-python version>/build-info.json
    tiny-models-<generator version>/tiny-small.gguf
    tiny-models-<generator version>/tiny-large.gguf

``examples/llama.yaml`` names these paths through the same variable, so after this script
``hotseat up --config examples/llama.yaml`` runs two real servers.

Usage::

    python scripts/llama/prepare.py          # build or reuse, print the paths
    python scripts/llama/prepare.py --json   # the same as one JSON object (for tests)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import build_server
import tiny_gguf


def models_dir() -> Path:
    return build_server.cache_root().expanduser() / f"tiny-models-{tiny_gguf.GENERATOR_VERSION}"


def ensure_models() -> dict[str, Path]:
    """The generated models, written first when any is missing."""
    directory = models_dir()
    paths = {spec.name: directory / f"{spec.name}.gguf" for spec in tiny_gguf.MODELS}
    if all(path.is_file() for path in paths.values()):
        return paths
    began = time.monotonic()
    written = tiny_gguf.write_all(directory)
    print(f"[tiny-gguf] wrote {len(written)} models to {directory} in "
          f"{time.monotonic() - began:.1f}s", file=sys.stderr)  # fmt: skip
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--jobs", "-j", type=int, default=None, help="build jobs (default: cores)")
    args = parser.parse_args(argv)
    try:
        server = build_server.ensure(jobs=args.jobs)
    except subprocess.CalledProcessError as exc:
        print(f"[llama-server] failed: {' '.join(map(str, exc.cmd))} exited with "
              f"{exc.returncode}", file=sys.stderr)  # fmt: skip
        return 1
    models = ensure_models()
    info_path = build_server.server_dir() / "build-info.json"
    info = json.loads(info_path.read_text()) if info_path.is_file() else {}
    if args.json:
        print(json.dumps({
            "cache": str(build_server.cache_root().expanduser()),
            "server": str(server),
            "version": build_server.LLAMA_CPP_PYTHON_VERSION,
            "build_seconds": info.get("build_seconds"),
            "models": {name: str(path) for name, path in models.items()},
        }))  # fmt: skip
        return 0
    print(f"llama-server {server}")
    for name, path in models.items():
        print(f"{name} {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
