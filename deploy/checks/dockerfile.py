"""The Dockerfile: multi-stage, non-root at run time, COPY sources that exist and are sent."""

from __future__ import annotations

import fnmatch
import re
import shlex
from collections.abc import Iterable, Iterator
from pathlib import Path

from deploy.checks.report import Report


def stages(path: Path) -> dict[str, list[str]]:
    """Stage name (or ``#n`` for an unnamed one) -> its instructions."""
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in instructions(path.read_text(encoding="utf-8")):
        if m := re.match(r"FROM\s+\S+(?:\s+AS\s+(\S+))?", line, re.IGNORECASE):
            current = found.setdefault(m[1] or f"#{len(found)}", [])
        if current is not None:
            current.append(line)
    return found


def instructions(text: str) -> Iterator[str]:
    """Instructions with continuation lines joined, comments and blanks left out."""
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        yield pending + line
        pending = ""


def check_dockerfile(report: Report, root: Path) -> None:
    found = stages(root / "Dockerfile")
    if len(found) < 2:
        report.fail("Dockerfile", "is not multi-stage")
    runtime = found.get("runtime", [])
    users = [line.split()[1] for line in runtime if line.upper().startswith("USER ")]
    if not users or users[-1].split(":")[0] in {"0", "root"}:
        report.fail("Dockerfile", "the runtime stage does not end as a non-root USER")
    ignored = dockerignore(root)
    for stage, lines in found.items():
        for source in _copy_sources(lines):
            if not (root / source).exists():
                report.fail("Dockerfile", f"stage {stage}: COPY {source}: does not exist")
            elif excluded(source, ignored):
                report.fail("Dockerfile", f"stage {stage}: COPY {source}: in .dockerignore")
    report.ok(f"Dockerfile: stages {', '.join(found)}")


def _copy_sources(lines: Iterable[str]) -> Iterator[str]:
    """Sources of the COPY instructions that read the build context."""
    for line in lines:
        words = shlex.split(line)
        if words[0].upper() != "COPY" or any(w.startswith("--from") for w in words):
            continue
        yield from (w for w in words[1:-1] if not w.startswith("--"))


def dockerignore(root: Path) -> list[str]:
    path = root / ".dockerignore"
    if not path.is_file():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [ln.strip().rstrip("/") for ln in lines if ln.strip() and not ln.startswith("#")]


def excluded(source: str, patterns: Iterable[str]) -> bool:
    """True when ``source`` (or a directory above it) matches a .dockerignore pattern."""
    parts = Path(source).parts
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    return any(
        fnmatch.fnmatch(prefix, pattern) or fnmatch.fnmatch(prefix, pattern.removeprefix("**/"))
        for pattern in patterns
        for prefix in prefixes
    )
