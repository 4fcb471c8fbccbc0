"""One list of problems that every check adds to."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Report:
    """Problems found, each one line."""

    problems: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)

    def fail(self, where: str, message: str) -> None:
        self.problems.append(f"{where}: {message}")

    def ok(self, what: str) -> None:
        self.checked.append(what)
