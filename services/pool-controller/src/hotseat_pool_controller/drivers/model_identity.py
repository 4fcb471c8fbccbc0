"""The identity of a model file, and the key that names a member's saved prompt caches.

A saved slot holds a model's KV cells and nothing that says which model: restored into
another model with the same shapes it would be silently wrong. So the files are named by a
key derived from what the cells depend on: the model file's identity (its size, its
modification time and a hash of its first MiB, where a GGUF file keeps its header and
metadata; never its name alone) and, for a process member, the command line and the
server executable (docs/adr/0007).
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path

HEADER_BYTES = 1 << 20
"""How much of the model file is hashed: its GGUF header and metadata, cheaply."""
KEY_CHARS = 16


class IdentityError(OSError):
    """The model file (or the executable) cannot be read."""


def file_identity(path: Path) -> str:
    """``size:mtime_ns:blake2b(first MiB)`` of ``path``; :class:`IdentityError` when unreadable."""
    try:
        stat = path.stat()
        with path.open("rb") as file:
            header = hashlib.blake2b(file.read(HEADER_BYTES), digest_size=16).hexdigest()
    except OSError as exc:
        raise IdentityError(f"cannot read model file {path}: {exc}") from exc
    return f"{stat.st_size}:{stat.st_mtime_ns}:{header}"


def modified_after(path: Path, moment: float) -> bool:
    """Whether ``path`` changed after ``moment`` (seconds since the epoch); True when
    unreadable (nothing can be proven of it)."""
    try:
        return path.stat().st_mtime > moment
    except OSError:
        return True


def executable_identity(command: str, path_env: str | None = None) -> str:
    """``size:mtime_ns`` of the executable ``command`` resolves to (empty when not found)."""
    found = shutil.which(command, path=path_env)
    if found is None:
        return ""
    try:
        stat = Path(found).stat()
    except OSError:
        return ""
    return f"{stat.st_size}:{stat.st_mtime_ns}"


def cache_key(parts: Iterable[str]) -> str:
    """A short, filename-safe hash of ``parts`` (order matters)."""
    digest = hashlib.blake2b(digest_size=16)
    for part in parts:
        digest.update(part.encode())
        digest.update(b"\x00")
    return digest.hexdigest()[:KEY_CHARS]


def model_argument(argv: Sequence[str]) -> str | None:
    """The model file named by ``-m PATH``, ``--model PATH`` or ``--model=PATH``."""
    for index, arg in enumerate(argv):
        if arg in {"-m", "--model"} and index + 1 < len(argv):
            return argv[index + 1]
        if arg.startswith("--model="):
            return arg.split("=", 1)[1]
    return None
