"""Two checkouts' pool benchmarks in one sitting, side by side.

Runs ``bench/pool_bench.py`` of a *before* and an *after* checkout in turns (before,
after, before, after, ...), so both meet the same machine noise, and prints the medians
of the figures the activation contract's changes must not make worse: the IfIdle skip
decision p50/p99, the pooled/unpooled throughput ratios, the swap orchestration overhead
and the acquire+release round trips.

Run (each checkout with its own ``make install`` done)::

    git worktree add /tmp/hotseat-before <commit> && make -C /tmp/hotseat-before install
    .venv/bin/python bench/pool_bench_compare.py --before /tmp/hotseat-before --after . --rounds 3
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
from pathlib import Path

FIGURES: dict[str, tuple[str, str]] = {
    # name: (the section's heading starts with, pattern within the section)
    "IfIdle skip p50 ms": ("IfIdle skip", r"p50 ([\d.]+) ms"),
    "IfIdle skip p99 ms": ("IfIdle skip", r"p99 ([\d.]+) ms"),
    "pooled/unpooled -c 1": ("router throughput", r"-c 1: .*?ratio ([\d.]+)"),
    "pooled/unpooled -c 8": ("router throughput", r"-c 8: .*?ratio ([\d.]+)"),
    "swap overhead median ms": ("swap orchestration", r"median ([\d.]+) ms"),
    "acquire+release p50 ms, 1 caller": ("acquire+release", r"1 concurrent: p50 ([\d.]+)"),
    "acquire+release p50 ms, 8 callers": ("acquire+release", r"8 concurrent: p50 ([\d.]+)"),
    "router client p50 ms, 8 callers": ("the same through", r"8 concurrent: p50 ([\d.]+)"),
    # CPU per acquire+release pair (less noisy than times on a shared machine)
    "controller CPU ms/pair, 1 caller": (
        "acquire+release",
        r"1 concurrent:.*?\n.*?controller ([\d.]+)",
    ),
    "controller CPU ms/pair, 8 callers": (
        "acquire+release",
        r"8 concurrent:.*?\n.*?controller ([\d.]+)",
    ),
    "redis CPU ms/pair, 8 callers": ("acquire+release", r"8 concurrent:.*?\n.*?redis ([\d.]+)"),
    "router CPU ms/pooled req, -c 8": ("router throughput", r"-c 8: .*?router ([\d.]+)"),
}
LOWER_IS_BETTER = {"IfIdle", "swap", "acquire", "router client", "CPU"}


def run(checkout: Path) -> str:
    done = subprocess.run(
        [str(checkout / ".venv/bin/python"), str(checkout / "bench/pool_bench.py")],
        cwd=checkout,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    if done.returncode != 0:
        sys.exit(f"{checkout}: pool_bench failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return done.stdout


def figures(output: str) -> dict[str, float]:
    sections = {part.split("\n", 1)[0]: part for part in output.split("== ")[1:]}
    found: dict[str, float] = {}
    for name, (heading, pattern) in FIGURES.items():
        section = next((text for head, text in sections.items() if head.startswith(heading)), "")
        match = re.search(pattern, section)
        if match is not None:
            found[name] = float(match.group(1))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="the checkout before")
    parser.add_argument("--after", type=Path, required=True, help="the checkout after")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each, in turns")
    parser.add_argument("--keep", type=Path, help="write every run's full output here")
    args = parser.parse_args()
    samples: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
    for n in range(args.rounds):
        for side, checkout in (("before", args.before), ("after", args.after)):
            print(f"round {n + 1}/{args.rounds}: {side} ({checkout})", flush=True)
            output = run(checkout.resolve())
            if args.keep is not None:
                args.keep.mkdir(parents=True, exist_ok=True)
                (args.keep / f"{side}-{n + 1}.txt").write_text(output)
            for name, value in figures(output).items():
                samples[side].setdefault(name, []).append(value)
    print(f"\nmedians of {args.rounds} runs each, in turns")
    print(f"{'figure':<36}{'before':>10}{'after':>10}   after/before")
    for name in FIGURES:
        before = samples["before"].get(name)
        after = samples["after"].get(name)
        if not before or not after:
            print(f"{name:<36}{'-':>10}{'-':>10}")
            continue
        b, a = statistics.median(before), statistics.median(after)
        better = "lower is better" if any(k in name for k in LOWER_IS_BETTER) else "higher"
        ratio = a / b if b else float("nan")
        print(f"{name:<36}{b:>10.2f}{a:>10.2f}   {ratio:.2f} ({better})")


if __name__ == "__main__":
    main()
