"""``hotseat check-config FILE``: exit 0 with a summary, 1 with every error and its path, 2 on
a usage error; the example configs in the repo all pass."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hotseat.cli import EXIT_INVALID, EXIT_OK, EXIT_USAGE, main
from tests.config.conftest import INVALID_DIR, example_files, expected_errors, invalid_files

HOTSEAT = Path(sys.executable).with_name("hotseat")


def run_hotseat(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(HOTSEAT), *map(str, args)], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize("path", invalid_files(), ids=lambda p: p.stem)
def test_check_config_prints_every_error_with_its_path(path: Path, capsys):
    """An invalid file exits 1 and prints a header plus one indented line per declared error."""
    status = main(["check-config", str(path)])
    out, err = capsys.readouterr()
    expected = expected_errors(path)
    assert status == EXIT_INVALID
    assert out == ""
    lines = err.splitlines()
    assert lines[0] == f"{path}: invalid ({len(expected)} error(s))"
    assert sorted(lines[1:]) == sorted(f"  {line}" for line in expected)


def test_examples_exist():
    """The repo ships at least one example config for check-config to vouch for."""
    assert example_files()


@pytest.mark.parametrize("path", example_files(), ids=lambda p: p.name)
def test_example_config_passes_check_config(path: Path):
    """Every example config in the repo is valid according to the real ``hotseat`` command."""
    result = run_hotseat("check-config", path)
    assert result.returncode == EXIT_OK, result.stderr
    assert result.stdout.startswith(f"{path}: valid\n")
    assert result.stderr == ""


def test_valid_config_summary_lists_what_it_declares():
    """The summary of a valid file names its backends, pools with members, and rules."""
    result = run_hotseat("check-config", example_files()[0])
    assert result.returncode == EXIT_OK, result.stderr
    summary = result.stdout
    assert "backend " in summary
    assert "pool " in summary
    assert "rule " in summary


def test_invalid_file_exits_1_through_the_real_entry_point():
    """The installed ``hotseat`` prints all errors of a file with several mistakes and exits 1."""
    path = INVALID_DIR / "several-errors.yaml"
    result = run_hotseat("check-config", path)
    assert result.returncode == EXIT_INVALID
    assert result.stdout == ""
    for line in expected_errors(path):
        assert f"  {line}\n" in result.stderr


def test_unreadable_file_is_reported_as_invalid(tmp_path: Path):
    """A path that does not exist is an invalid config (exit 1) with the reason printed."""
    missing = tmp_path / "nope.yaml"
    result = run_hotseat("check-config", missing)
    assert result.returncode == EXIT_INVALID
    assert f"{missing}: invalid (1 error(s))" in result.stderr
    assert "cannot read file: No such file or directory" in result.stderr


@pytest.mark.parametrize(
    "argv", [["check-config"], ["check-config", "a.yaml", "b.yaml"], ["check-config", "--bogus"]]
)
def test_usage_errors_exit_2(argv: list[str]):
    """A missing or extra argument, or an unknown option, is a usage error (exit 2)."""
    result = run_hotseat(*argv)
    assert result.returncode == EXIT_USAGE
    assert "usage:" in result.stderr


@pytest.mark.parametrize(
    ("extra", "line"),
    [
        ("", "  models no rule names: refused (404 model_not_found)"),
        ("defaultRoute: a\n", "  models no rule names: refused (404 model_not_found)"),
        (
            "defaultRoute: a\nunknownModels: DefaultRoute\n",
            "  models no rule names: sent to a",
        ),
    ],
)
def test_summary_says_where_models_no_rule_names_go(extra: str, line: str, tmp_path, capsys):
    """The summary says whether a model no rule names is refused or sent to defaultRoute."""
    path = tmp_path / "hotseat.yaml"
    path.write_text("backends: [{name: a, address: 'http://127.0.0.1:9'}]\n" + extra)
    assert main(["check-config", str(path)]) == EXIT_OK
    assert line in capsys.readouterr().out.splitlines()
