"""``hotseat-sim``: serve one backend of the config as a simulated inference server.

The backend's ``address`` gives the default host and port (``--host``/``--port``
override them); a pooled member starts unloaded unless ``--loaded true``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from urllib.parse import urlsplit

from hotseat_common.config import ConfigError, load_config
from hotseat_common.logging import configure_logging
from hotseat_common.settings import load_settings
from hotseat_sim.profile import ProfileError, SimProfile, resolve_profile
from hotseat_sim.settings import SimSettings

EXIT_USAGE = 2


def _usage(message: str) -> int:
    print(f"hotseat-sim: {message}", file=sys.stderr)  # noqa: T201 - before logging exists
    return EXIT_USAGE


def bind_address(settings: SimSettings, address: str) -> SimSettings:
    """Listen where the backend's address points unless ``--host``/``--port`` say otherwise."""
    parts = urlsplit(address)
    update: dict[str, object] = {}
    if "host" not in settings.model_fields_set and parts.hostname:
        update["host"] = parts.hostname
    if "port" not in settings.model_fields_set:
        update["port"] = parts.port or (443 if parts.scheme == "https" else 80)
    return settings.model_copy(update=update)


def prepare(argv: Sequence[str] | None = None) -> tuple[SimSettings, SimProfile] | int:
    """Settings and profile, or an exit status after printing what is wrong."""
    settings = load_settings(SimSettings, argv, prog="hotseat-sim", description=__doc__ or "")
    if settings.config is None:
        return _usage("--config (or HOTSEAT_CONFIG) is required")
    if settings.backend is None:
        return _usage("--backend (or HOTSEAT_BACKEND) is required")
    try:
        config = load_config(settings.config)
    except ConfigError as exc:
        lines = "\n".join(f"  {issue}" for issue in exc.issues)
        return _usage(f"{exc.source}: invalid config\n{lines}")
    except OSError as exc:
        return _usage(f"cannot read {settings.config}: {exc}")
    try:
        profile = resolve_profile(config, settings.backend)
    except ProfileError as exc:
        return _usage(str(exc))
    backend = config.backend(settings.backend)
    assert backend is not None  # noqa: S101 - resolve_profile found it
    return bind_address(settings, backend.address), profile


def main(argv: Sequence[str] | None = None) -> None:
    prepared = prepare(argv)
    if isinstance(prepared, int):
        sys.exit(prepared)
    settings, profile = prepared
    # The web stack is imported only once the invocation is known to be good (fast exit 2).
    from hotseat_common.service import run_app  # noqa: PLC0415
    from hotseat_sim.app import create_app  # noqa: PLC0415

    configure_logging(
        "hotseat-sim",
        level=settings.log_level,
        fmt=settings.log_format,
        instance=settings.instance or f"sim-{profile.backend}",
    )
    run_app(create_app(settings, profile), settings)


if __name__ == "__main__":
    main()
