"""The configuration examples in docs/drivers.md stay valid."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hotseat_common.config import load_config
from hotseat_pool_controller.drivers import build_driver

DOC = Path(__file__).parents[2] / "docs" / "drivers.md"
EXAMPLES = re.findall(r"```yaml\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.DOTALL)


def test_the_page_has_the_three_recipes():
    """docs/drivers.md shows a process, a vLLM and an Ollama example."""
    assert len(EXAMPLES) == 3


@pytest.mark.parametrize("example", EXAMPLES, ids=["process", "vllm", "ollama"])
async def test_example_is_a_valid_config_its_driver_accepts(tmp_path, example):
    """Each example loads as a config, and its pool's driver can be built from it."""
    path = tmp_path / "hotseat.yaml"
    path.write_text(example, encoding="utf-8")
    config = load_config(path)
    assert config.pools
    for pool in config.pools:
        driver = build_driver(config, pool)
        await driver.aclose()
