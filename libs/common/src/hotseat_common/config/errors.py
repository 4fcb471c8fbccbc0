"""Config errors: each one a path into the file and a reason a person can act on."""

from __future__ import annotations

from dataclasses import dataclass

from hotseat_common.errors import ErrorCode, HotseatError


@dataclass(frozen=True, slots=True)
class ConfigIssue:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class ConfigError(HotseatError):
    """The config file is unreadable or invalid; ``issues`` lists every problem found."""

    code = ErrorCode.INVALID_CONFIG

    def __init__(self, source: str, issues: list[ConfigIssue]) -> None:
        self.source = source
        self.issues = issues
        lines = "\n".join(f"  {issue}" for issue in issues)
        super().__init__(f"{source}: {len(issues)} error(s)\n{lines}")
