"""Optional client API keys: ``Authorization: Bearer <key>``, compared in constant time."""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Iterable
from pathlib import Path

from hotseat_common.config.model import RouterPolicy
from hotseat_router.settings import RouterSettings

_BEARER = b"bearer "


def _split(text: str) -> list[str]:
    keys = []
    for line in text.replace(",", "\n").splitlines():
        key = line.strip()
        if key and not key.startswith("#"):
            keys.append(key)
    return keys


def _read(path: Path) -> list[str]:
    return _split(path.read_text(encoding="utf-8"))


def load_api_keys(settings: RouterSettings, policy: RouterPolicy) -> list[str]:
    """Every configured key: the config's env var and file, then the settings' own."""
    keys: list[str] = []
    if policy.api_keys is not None:
        if policy.api_keys.env:
            keys += _split(os.environ.get(policy.api_keys.env, ""))
        if policy.api_keys.file:
            keys += _read(Path(policy.api_keys.file))
    if settings.api_keys is not None:
        keys += _split(settings.api_keys.get_secret_value())
    if settings.api_keys_file is not None:
        keys += _read(settings.api_keys_file)
    return keys


class ApiKeyCheck:
    """Accepts any request when no key is configured, else only a known Bearer key."""

    def __init__(self, keys: Iterable[str]) -> None:
        # Digests have one length, so comparing them leaks neither a key's length nor content.
        self._digests = [hashlib.sha256(k.encode()).digest() for k in keys]

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    def client_of(self, authorization: bytes | None, address: str) -> str:
        """Who a request comes from: its key (as a short digest, never the key itself)
        when keys are configured, else its peer address."""
        return self.key_id(authorization) or address

    def key_id(self, authorization: bytes | None) -> str | None:
        """The request's key as a short digest (never the key itself) when keys are
        configured: what token usage is counted by; ``None`` without keys."""
        if self._digests and authorization is not None:
            return hashlib.sha256(authorization[7:].strip()).hexdigest()[:16]
        return None

    def allows(self, authorization: bytes | None) -> bool:
        if not self._digests:
            return True
        if authorization is None or authorization[:7].lower() != _BEARER:
            return False
        digest = hashlib.sha256(authorization[7:].strip()).digest()
        found = False
        for known in self._digests:
            found |= hmac.compare_digest(digest, known)
        return found
