"""What the build machine lends the images the compose test builds: the Debian mirror its
apt uses, the PyPI index its pip uses, and the CA bundle that pip trusts.

Nothing here is written into a committed file: every value is read from the machine at
build time, so the same files build behind a mirror, a proxy or neither.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

SUITE = "bookworm"
SUITES = frozenset({SUITE, f"{SUITE}-updates", f"{SUITE}-security"})
DEFAULT_MIRROR = "http://deb.debian.org/debian"
APT_SOURCES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))
PIP_ARGS = {"index-url": "PIP_INDEX_URL", "extra-index-url": "PIP_EXTRA_INDEX_URL"}
"""pip settings passed into image builds, by the build argument that carries each."""


@dataclass(frozen=True)
class AptSource:
    """One ``deb`` line: where a suite's packages come from."""

    uri: str
    suite: str
    components: tuple[str, ...]

    def line(self) -> str:
        return f"deb {self.uri} {self.suite} {' '.join(self.components)}"


@dataclass(frozen=True)
class PackageSources:
    apt: tuple[AptSource, ...]
    """The host's Debian sources for the bookworm suites (the images' sources.list)."""
    pip: Mapping[str, str]
    """Build arguments for pip in an image (``PIP_INDEX_URL`` ...), only those set."""
    ca_bundle: Path | None
    """The CA bundle the host's pip trusts, installed into the base image."""

    @property
    def mirror(self) -> str:
        """Where debootstrap fetches the base system."""
        return next((s.uri for s in self.apt if s.suite == SUITE), DEFAULT_MIRROR)


def apt_sources(paths: Iterable[Path] = APT_SOURCES) -> tuple[AptSource, ...]:
    """The enabled ``deb`` sources of the bookworm suites, in one-line and deb822 files."""
    found: list[AptSource] = []
    for path in _source_files(paths):
        text = path.read_text(encoding="utf-8", errors="replace")
        entries = _deb822(text) if path.suffix == ".sources" else _one_line(text)
        found.extend(e for e in entries if e.suite in SUITES and e not in found)
    return tuple(found)


def _source_files(paths: Iterable[Path]) -> Iterator[Path]:
    for path in paths:
        if path.is_dir():
            yield from sorted(p for p in path.iterdir() if p.suffix in {".list", ".sources"})
        elif path.is_file():
            yield path


def _one_line(text: str) -> Iterator[AptSource]:
    for raw in text.splitlines():
        words = re.sub(r"\[[^]]*\]", " ", raw.split("#", 1)[0]).split()  # no [options]
        if len(words) >= 4 and words[0] == "deb":
            yield AptSource(words[1].rstrip("/"), words[2], tuple(words[3:]))


def _deb822(text: str) -> Iterator[AptSource]:
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        for raw in stanza.splitlines():
            if raw.startswith("#") or ":" not in raw:
                continue
            key, _, value = raw.partition(":")
            fields[key.strip().lower()] = value.strip()
        if "deb" not in fields.get("types", "").split() or fields.get("enabled") == "no":
            continue
        for uri in fields.get("uris", "").split():
            for suite in fields.get("suites", "").split():
                yield AptSource(uri.rstrip("/"), suite, tuple(fields.get("components", "").split()))


def pip_config(python: str = sys.executable) -> dict[str, str]:
    """pip's effective settings (``pip config list``): an environment variable wins over a
    file, and a later file over an earlier one."""
    listing = subprocess.run(
        [python, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    ).stdout
    from_files: dict[str, str] = {}
    from_env: dict[str, str] = {}
    for line in listing.splitlines():
        scope, _, rest = line.partition(".")
        key, _, value = rest.partition("=")
        value = value.strip().strip("'\"")
        if scope == ":env:":
            from_env[key] = value
        elif scope in {"global", "install", "download"}:
            from_files[key] = value
    return from_files | from_env


def pip_build_args(config: Mapping[str, str]) -> dict[str, str]:
    """The index settings an image build can use: only network URLs (a ``file:`` index of
    the host is not inside the build), and the trusted hosts that go with them."""
    args: dict[str, str] = {}
    for key, arg in PIP_ARGS.items():
        urls = [u for u in config.get(key, "").split() if u.startswith(("http://", "https://"))]
        if urls:
            args[arg] = " ".join(urls)
    if args and config.get("trusted-host"):
        args["PIP_TRUSTED_HOST"] = config["trusted-host"]
    return args


def package_sources(python: str = sys.executable) -> PackageSources:
    config = pip_config(python)
    cert = config.get("cert")
    bundle = Path(cert) if cert and Path(cert).is_file() else None
    return PackageSources(apt=apt_sources(), pip=pip_build_args(config), ca_bundle=bundle)


def install_missing(commands: Mapping[str, str]) -> list[str]:
    """Install, with apt-get, the Debian package of each command (name -> package) that is
    not on PATH; returns the packages installed."""
    packages = sorted({pkg for command, pkg in commands.items() if not shutil.which(command)})
    if not packages:
        return []
    apt = shutil.which("apt-get")
    if apt is None:
        raise SystemExit(f"compose-test: install {', '.join(packages)} (no apt-get here)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run([apt, "update", "-q"], check=True, env=env, stdout=subprocess.DEVNULL)
    subprocess.run(
        [apt, "install", "-y", "-q", "--no-install-recommends", *packages],
        check=True, env=env, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    return packages
