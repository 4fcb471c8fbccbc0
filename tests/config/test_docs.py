"""docs/configuration.md documents every config field and matches the schema."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest
from pydantic import BaseModel, ConfigDict

from hotseat_common.config.model import HotseatConfig
from tests.config.conftest import REPO_ROOT

GENERATOR = REPO_ROOT / "scripts" / "gen_config_docs.py"
DOC = REPO_ROOT / "docs" / "configuration.md"


@pytest.fixture(scope="module")
def generator() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("gen_config_docs", GENERATOR)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their annotations through it
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_checked_in_doc_matches_the_generator(generator: ModuleType):
    """The field reference in docs/configuration.md is exactly what the schema generates."""
    current = DOC.read_text(encoding="utf-8")
    assert generator.render_doc(current) == current, (
        "docs/configuration.md is out of date: run .venv/bin/python scripts/gen_config_docs.py"
    )


def test_reference_lists_every_field_of_every_section(generator: ModuleType):
    """Each model reachable from the config has a table naming each of its fields."""
    reference = generator.render_reference()
    for section in generator.sections():
        assert f"### {section.title}\n" in reference
        for name, field in section.model.model_fields.items():
            assert f"| `{field.alias or name}` |" in reference


def test_documented_defaults_are_the_promised_ones(generator: ModuleType):
    """The reference shows the product defaults in config syntax (durations as strings)."""
    reference = generator.render_reference()
    for row in [
        "| `poolActivation` | `Wait` \\| `IfIdle` | `Wait` |",
        "| `swapBudget` | [duration](#writing-values) | `5m` |",
        "| `swapTimeout` | [duration](#writing-values) > 0 | `10m` |",
        "| `maxWaiters` | integer ≥ 1 | `1000` |",
        "| `streamIdleTimeout` | [duration](#writing-values) > 0 | `5m` |",
        "| `requestTimeout` | [duration](#writing-values) > 0 | `10m` |",
        "| `maxBodyBytes` | integer > 0 | `33554432` |",
    ]:
        assert row in reference


def test_a_field_without_description_fails_the_generator(generator: ModuleType):
    """Adding a field with no docstring makes generation fail, naming the field."""

    class Undocumented(BaseModel):
        model_config = ConfigDict(use_attribute_docstrings=True)

        documented: int = 1
        """Has words."""
        bare: int = 2

    with pytest.raises(generator.UndocumentedFieldError, match=r"Undocumented\.bare"):
        generator.render_reference(Undocumented)
    assert generator.render_reference(HotseatConfig)


def test_check_mode_reports_a_stale_doc(generator: ModuleType, tmp_path, monkeypatch):
    """``--check`` exits 1 on a doc whose reference differs from the schema, 0 when fresh."""
    stale = tmp_path / "configuration.md"
    stale.write_text(f"# x\n\n{generator.BEGIN}\nold\n{generator.END}\n", encoding="utf-8")
    monkeypatch.setattr(generator, "DOC", stale)
    assert generator.main(["--check"]) == 1
    assert generator.main([]) == 0
    assert generator.main(["--check"]) == 0
