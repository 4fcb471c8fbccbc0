"""``${NAME}`` and ``~`` in a process member's command, ``cwd`` and ``logFile``.

A config file is shared by machines whose paths differ (a model cache under each user's
home, a binary built per host), so the ``process`` driver expands, when it starts:

- ``${NAME}``: the variable from the controller's environment with the member's ``env``
  on top; an unset variable is an error at load time, never an empty string.
- ``${NAME:-default}``: the default when the variable is unset or empty.
- ``$$``: a literal ``$``. A ``$`` not followed by ``{`` or ``$`` is left alone, so
  ``sh -c 'exec server --port $PORT'`` still reaches the shell unchanged.
- ``~`` at the start of a value (after the variables are expanded), as the shell reads
  it: ``~/models`` is under the home directory of the controller's user.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["Expanded", "expand"]

_TOKEN = re.compile(
    r"\$\$|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?P<has_default>:-(?P<default>[^}]*))?\}"
)


@dataclass(frozen=True)
class Expanded:
    value: str
    missing: tuple[str, ...] = ()
    """Variables the value names that are unset and have no default."""


def expand(value: str, env: Mapping[str, str]) -> Expanded:
    """``value`` with its variables and leading ``~`` expanded against ``env``."""
    missing: list[str] = []

    def replace(match: re.Match[str]) -> str:
        if match[0] == "$$":
            return "$"
        name = match["name"]
        found = env.get(name)
        if match["has_default"] is not None:
            return found or match["default"]
        if found is None:
            missing.append(name)
            return match[0]
        return found

    result = _TOKEN.sub(replace, value)
    if result.startswith("~"):
        result = os.path.expanduser(result)  # noqa: PTH111 - keeps the argument's spelling
    return Expanded(result, tuple(missing))
