"""Shared helpers for config tests: the fixture files and their declared expectations."""

from __future__ import annotations

import re
from pathlib import Path

CONFIG_TESTS = Path(__file__).resolve().parent
INVALID_DIR = CONFIG_TESTS / "invalid"
REPO_ROOT = CONFIG_TESTS.parents[1]
EXAMPLES_DIR = REPO_ROOT / "examples"

_EXPECT = re.compile(rb"^# expect: (.*)$")


def invalid_files() -> list[Path]:
    return sorted(INVALID_DIR.glob("*.yaml"))


def expected_errors(path: Path) -> list[str]:
    """The ``# expect: ...`` lines of a fixture's header comment, in order."""
    expected: list[str] = []
    for line in path.read_bytes().splitlines():
        if not line.startswith(b"#"):
            break
        if match := _EXPECT.match(line):
            expected.append(match.group(1).decode("utf-8").rstrip())
    return expected


def example_files() -> list[Path]:
    return sorted([*EXAMPLES_DIR.rglob("*.yaml"), *EXAMPLES_DIR.rglob("*.yml")])
