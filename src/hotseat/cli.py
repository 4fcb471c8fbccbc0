"""``hotseat``: the operator CLI (check-config, up, status, audit)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from hotseat import audit_cli, status_cli
from hotseat.stack_plan import DEFAULT_PORTS
from hotseat_common.config import ConfigError, HotseatConfig, UnknownModels, load_config
from hotseat_common.durations import format_duration

EXIT_OK = 0
EXIT_INVALID = 1
EXIT_USAGE = 2
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, as a shell reports a command cut by `| head`

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "examples" / "hotseat.yaml"


def summarize(config: HotseatConfig) -> str:
    """A short human summary of what a config declares."""
    header = (
        f"router {config.router.name}: {len(config.backends)} backend(s), "
        f"{len(config.pools)} pool(s), {len(config.rules)} rule(s)"
    )
    lines = [header]
    lines.extend(
        f"  backend {b.name} ({b.tier}) {b.address}"
        + (f" pool {b.pool.name}/{b.pool.member}" if b.pool else "")
        for b in config.backends
    )
    for pool in config.pools:
        members = ", ".join(m.name for m in pool.members)
        default = f", default {pool.default}" if pool.default else ""
        lines.append(
            f"  pool {pool.name} [{pool.driver.kind}] members: {members}; "
            f"swapBudget {format_duration(pool.swap_budget)}, busySignal {pool.busy_signal}"
            f"{default}"
        )
    lines.extend(
        f"  rule {r.name}: {' -> '.join(r.route.backends)} ({r.route.pool_activation})"
        for r in config.rules
    )
    if config.default_route:
        lines.append(f"  defaultRoute {config.default_route} ({config.default_route_strategy})")
    if config.unknown_models is UnknownModels.DEFAULT_ROUTE:
        lines.append(f"  models no rule names: sent to {config.default_route}")
    else:
        lines.append("  models no rule names: refused (404 model_not_found)")
    return "\n".join(lines)


def cmd_check_config(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.file)
    except ConfigError as exc:
        print(f"{exc.source}: invalid ({len(exc.issues)} error(s))", file=sys.stderr)
        for issue in exc.issues:
            print(f"  {issue}", file=sys.stderr)
        return EXIT_INVALID
    print(f"{args.file}: valid")
    print(summarize(config))
    return EXIT_OK


def cmd_up(args: argparse.Namespace) -> int:
    from hotseat.up import run_up  # noqa: PLC0415 - keeps check-config free of process code

    ports = {"router": args.port, "controller": args.controller_port, "audit": args.audit_port}
    return run_up(
        config_path=Path(args.config),
        ports=ports,
        nats_url=args.nats_url,
        redis_url=args.redis_url,
    )


def _port(text: str) -> int:
    port = int(text)
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text} is not a port (0 to 65535; 0: any free one)")
    return port


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hotseat", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    check = sub.add_parser("check-config", help="validate a config file")
    check.add_argument("file", type=Path)
    check.set_defaults(func=cmd_check_config)

    up = sub.add_parser("up", help="run a whole local stack in the foreground")
    up.add_argument("--config", default=str(DEFAULT_CONFIG), help="config file")
    for flag, service in (("--port", "router"), ("--controller-port", "controller"),
                          ("--audit-port", "audit")):  # fmt: skip
        up.add_argument(
            flag,
            type=_port,
            default=DEFAULT_PORTS[service],
            help=f"the {service}'s port (default %(default)s; 0: any free port)",
        )
    up.add_argument(
        "--nats-url",
        default=os.environ.get("HOTSEAT_NATS_URL") or None,
        help="reuse this NATS (env HOTSEAT_NATS_URL; default: launch a private one)",
    )
    up.add_argument(
        "--redis-url",
        default=os.environ.get("HOTSEAT_REDIS_URL") or None,
        help="reuse this Redis (env HOTSEAT_REDIS_URL; default: launch a private one)",
    )
    up.set_defaults(func=cmd_up)

    audit_cli.register(sub)
    status_cli.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0) and EXIT_USAGE
    result: int = args.func(args)
    return result


def entry() -> None:
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (`hotseat status --json | head`): not an error of ours.
        # Point stdout at /dev/null so the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = EXIT_BROKEN_PIPE
    sys.exit(code)


if __name__ == "__main__":
    entry()
