"""``hotseat-controller``: the pool controller service."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from hotseat_common.config import ConfigError, load_config
from hotseat_common.logging import configure_logging, get_logger
from hotseat_common.service import run_app
from hotseat_common.settings import load_settings
from hotseat_pool_controller.app import create_app
from hotseat_pool_controller.settings import ControllerSettings

EXIT_CONFIG = 2


def main(argv: Sequence[str] | None = None) -> None:
    settings = load_settings(
        ControllerSettings,
        argv,
        prog="hotseat-controller",
        description="Hotseat pool controller: residency, swaps and activation leases.",
    )
    configure_logging(
        "controller",
        level=settings.log_level,
        fmt=settings.log_format,
        instance=settings.instance_name(),
    )
    log = get_logger(__name__)
    if settings.config is None:
        log.error("config_missing", hint="pass --config or set HOTSEAT_CONFIG")
        sys.exit(EXIT_CONFIG)
    try:
        config = load_config(settings.config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)  # noqa: T201 - the path-precise errors, as written
        sys.exit(EXIT_CONFIG)
    run_app(create_app(settings, config), settings)


if __name__ == "__main__":
    main()
