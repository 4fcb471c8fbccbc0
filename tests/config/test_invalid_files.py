"""Every file under tests/config/invalid is rejected with exactly the errors it declares."""

from __future__ import annotations

from pathlib import Path

import pytest

from hotseat_common.config import ConfigError, load_config
from tests.config.conftest import expected_errors, invalid_files


def test_there_are_enough_invalid_files():
    """The invalid corpus covers at least 30 distinct mistakes, each declaring its errors."""
    files = invalid_files()
    assert len(files) >= 30
    assert all(expected_errors(f) for f in files), [f.name for f in files if not expected_errors(f)]


@pytest.mark.parametrize("path", invalid_files(), ids=lambda p: p.stem)
def test_invalid_file_reports_exactly_its_declared_errors(path: Path):
    """Loading the file fails with exactly the declared error lines: path, value and reason."""
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    reported = [str(issue) for issue in caught.value.issues]
    assert sorted(reported) == sorted(expected_errors(path))
    assert caught.value.source == str(path)
