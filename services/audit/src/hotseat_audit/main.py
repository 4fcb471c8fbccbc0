"""``hotseat-audit``: read settings, then serve until SIGTERM."""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence
from types import FrameType

from pydantic import ValidationError

from hotseat_audit.app import create_app
from hotseat_audit.settings import AuditSettings
from hotseat_audit.store import parse_dsn
from hotseat_common.logging import configure_logging
from hotseat_common.service import run_app
from hotseat_common.settings import load_settings

EXIT_FAILED = 1
EXIT_USAGE = 2


def main(argv: Sequence[str] | None = None) -> None:
    try:
        settings = load_settings(
            AuditSettings,
            argv,
            prog="hotseat-audit",
            description="Store every Hotseat audit event once and serve queries over them.",
        )
        parse_dsn(settings.dsn)
        settings.cursor_key_bytes()
    except (ValidationError, ValueError) as exc:
        print(f"hotseat-audit: invalid settings: {exc}", file=sys.stderr)  # noqa: T201
        sys.exit(EXIT_USAGE)
    configure_logging(
        "audit", level=settings.log_level, fmt=settings.log_format, instance=settings.instance
    )
    app, supervisor = create_app(settings)

    def exit_after_shutdown(_signum: int, _frame: FrameType | None) -> None:
        # uvicorn handles SIGTERM/SIGINT while serving, then restores this handler and
        # raises the signal again: a graceful stop exits 0, a dead background loop 1.
        raise SystemExit(EXIT_FAILED if supervisor.failed else 0)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, exit_after_shutdown)
    run_app(app, settings)
    sys.exit(EXIT_FAILED if supervisor.failed else 0)


if __name__ == "__main__":
    main()
