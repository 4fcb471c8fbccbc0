"""``hotseat-router``: read settings and config once, then serve until SIGTERM."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from functools import partial
from pathlib import Path

from pydantic import SecretStr

from hotseat_common.config import ConfigError, load_config
from hotseat_common.logging import configure_logging
from hotseat_common.service import MULTIPROC_ENV, run_app
from hotseat_common.settings import load_settings
from hotseat_router.app import create_app
from hotseat_router.connection import LimitedHttpProtocol
from hotseat_router.memory import return_large_blocks_to_the_os
from hotseat_router.settings import RouterSettings, connection_limits

EXIT_CONFIG = 2


def _as_env(settings: RouterSettings) -> dict[str, str]:
    """The settings as ``HOTSEAT_*`` variables, so worker processes read the same ones."""
    env = {}
    for name in RouterSettings.model_fields:
        value = getattr(settings, name)
        if value is None:
            continue
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        env["HOTSEAT_" + name.upper()] = str(value)
    return env


@contextlib.contextmanager
def _shared_metrics_dir() -> Iterator[None]:
    """The workers' shared metrics directory (prometheus-client's multiprocess mode): the
    operator's (``PROMETHEUS_MULTIPROC_DIR``, emptied of a previous run's files), else a
    private one removed at exit."""
    given = os.environ.get(MULTIPROC_ENV)
    if given:
        for stale in Path(given).glob("*.db"):
            stale.unlink()
        yield
        return
    with tempfile.TemporaryDirectory(prefix="hotseat-router-metrics-") as path:
        os.environ[MULTIPROC_ENV] = path
        try:
            yield
        finally:
            del os.environ[MULTIPROC_ENV]


def main(argv: Sequence[str] | None = None) -> int:
    settings = load_settings(
        RouterSettings,
        argv,
        prog="hotseat-router",
        description="Hotseat router: the OpenAI-compatible data plane.",
    )
    configure_logging(
        "router", level=settings.log_level, fmt=settings.log_format, instance=settings.instance
    )
    if settings.config is None:
        sys.stderr.write("hotseat-router: --config (or HOTSEAT_CONFIG) is required\n")
        return EXIT_CONFIG
    try:
        config = load_config(settings.config)
    except ConfigError as exc:
        sys.stderr.write(f"hotseat-router: invalid config {exc}\n")
        return EXIT_CONFIG
    if settings.body_budget_bytes < config.router.max_body_bytes:
        sys.stderr.write(
            f"hotseat-router: --body-budget-bytes ({settings.body_budget_bytes}) is smaller"
            f" than router.maxBodyBytes ({config.router.max_body_bytes}): a body the config"
            " allows could never be buffered\n"
        )
        return EXIT_CONFIG
    http = partial(LimitedHttpProtocol, limits=connection_limits(settings))
    return_large_blocks_to_the_os()
    if settings.workers > 1:
        os.environ.update(_as_env(settings))
        with _shared_metrics_dir():
            run_app(
                "hotseat_router.app:app_from_env",
                settings,
                workers=settings.workers,
                factory=True,
                http=http,
            )
    else:
        run_app(create_app(settings, config), settings, http=http)
    return 0
