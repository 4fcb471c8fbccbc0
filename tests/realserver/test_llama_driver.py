"""The ``process`` driver against real ``llama-server`` processes serving generated models."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from hotseat_common.config.model import HotseatConfig
from hotseat_pool_controller.drivers import DriverError, build_driver
from hotseat_pool_controller.drivers.process import ProcessDriver
from tests.realserver.conftest import Llama
from tests.realserver.support import (
    alive,
    chat,
    hanging,
    llama_config,
    pid_of,
    port_of,
    port_open,
    slots_busy,
    streaming,
)

pytestmark = pytest.mark.realserver

MakeDriver = Callable[..., tuple[ProcessDriver, dict[str, Any]]]


@pytest.fixture
async def make_driver(llama: Llama, tmp_path: Path, member_pids: None) -> AsyncIterator[MakeDriver]:
    made: list[ProcessDriver] = []

    def make(**options: Any) -> tuple[ProcessDriver, dict[str, Any]]:
        document = llama_config(llama, tmp_path / "members", **options)
        config = HotseatConfig.model_validate(document)
        pool = config.pool("cpu0")
        assert pool is not None
        driver = build_driver(config, pool)
        assert isinstance(driver, ProcessDriver)
        made.append(driver)
        return driver, document

    yield make
    for driver in made:
        await driver.aclose()


def url(document: dict[str, Any], member: str) -> str:
    return f"http://127.0.0.1:{port_of(document, member)}"


async def test_load_serves_chat_slots_and_metrics_then_unload_frees_everything(
    make_driver, tmp_path
):
    """load returns with llama-server ready (health 200, idle /slots, llamacpp:* metrics, a
    chat answer); its output is in the member's log; unload leaves no process, no port."""
    driver, document = make_driver()
    data = tmp_path / "members"
    await driver.load("large", epoch=1)
    base = url(document, "large")
    async with httpx.AsyncClient(timeout=10, trust_env=False) as client:
        assert (await client.get(f"{base}/health")).status_code == 200
        metrics = (await client.get(f"{base}/metrics")).text
    assert "llamacpp:prompt_tokens_total" in metrics
    assert await driver.is_idle("large")
    answer = await chat(base, "large", max_tokens=8)
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["completion_tokens"] == 8
    log_text = (data / "cpu0" / "large.log").read_text(errors="replace")
    assert "--- hotseat: starting large (epoch 1)" in log_text
    assert "tiny-large" in log_text  # llama-server's own output reached the log
    pid = pid_of(data, "large")
    assert pid is not None
    assert alive(pid)
    await driver.unload("large", epoch=2)
    assert not alive(pid)
    assert not port_open(port_of(document, "large"))
    assert pid_of(data, "large") is None
    assert await driver.residency() == {"small": False, "large": False}


async def test_is_idle_follows_the_real_slots(make_driver):
    """is_idle is false while a real slot generates, true once the stream has ended."""
    driver, document = make_driver()
    await driver.load("large", epoch=1)
    # Long enough (several seconds) that the stream cannot end between its first chunk
    # and the two reads of /slots on a loaded machine (400 tokens took 0.5 s and once did).
    async with streaming(url(document, "large"), "large", max_tokens=4000) as stream:
        assert await slots_busy(port_of(document, "large"))
        assert not await driver.is_idle("large")
        result = await stream.task
    assert result.finished, result
    assert await driver.is_idle("large")


async def test_idle_member_stops_on_sigterm_alone(make_driver):
    """An idle llama-server exits on SIGTERM: unload ends before the grace period, and no
    SIGKILL was needed."""
    driver, _ = make_driver(grace="60s")
    await driver.load("small", epoch=1)
    run = driver._running["small"]
    started = time.monotonic()
    await driver.unload("small", epoch=2)
    assert time.monotonic() - started < 60  # over before the grace could run out
    assert run.exit_code() != -signal.SIGKILL


async def test_request_in_flight_makes_sigterm_hang_and_unload_kills_after_the_grace(
    make_driver,
):
    """llama-server ignores SIGTERM while a request is in flight: unload SIGKILLs it after
    stopGracePeriod and returns with process and port gone; its stream is cut."""
    driver, document = make_driver(grace="1.5s")
    await driver.load("large", epoch=1)
    run = driver._running["large"]
    port = port_of(document, "large")
    async with (
        streaming(url(document, "large"), "large", max_tokens=3000) as stream,
        hanging(url(document, "large"), port, "large"),
    ):
        started = time.monotonic()
        await driver.unload("large", epoch=2)
        elapsed = time.monotonic() - started
        result = await stream.task
    assert run.exit_code() == -signal.SIGKILL, "SIGTERM alone ended a busy llama-server"
    assert elapsed >= 1.5, "killed before its grace period was over"
    assert not alive(run.pid)
    assert not port_open(port)
    assert not result.finished, result


async def test_member_serving_a_stream_is_stopped_within_the_grace(make_driver):
    """A stream alone: llama-server either hangs on SIGTERM (then it is SIGKILLed at the
    grace) or cancels the stream and exits; either way unload returns long before the
    stream would have ended, with process and port gone."""
    driver, document = make_driver(grace="1.5s")
    await driver.load("large", epoch=1)
    run = driver._running["large"]
    async with streaming(url(document, "large"), "large", max_tokens=3000) as stream:
        started = time.monotonic()
        await driver.unload("large", epoch=2)
        elapsed = time.monotonic() - started
        result = await stream.task
    if run.exit_code() == -signal.SIGKILL:
        assert elapsed >= 1.5, "killed before its grace period was over"
    assert not alive(run.pid)
    assert not port_open(port_of(document, "large"))
    assert not result.finished, result


async def test_member_killed_out_of_band_reads_not_ready_and_reloads(make_driver, tmp_path):
    """A llama-server SIGKILLed behind the driver's back reads not ready and not resident;
    the next load starts a fresh process that serves."""
    driver, document = make_driver()
    await driver.load("small", epoch=1)
    old = driver._running["small"].pid
    os.kill(old, signal.SIGKILL)
    await driver._running["small"].wait_exit(5)
    assert not await driver.is_ready("small")
    assert await driver.residency() == {"small": False, "large": False}
    with pytest.raises(DriverError):
        await driver.is_idle("small")
    await driver.load("small", epoch=2)
    new = pid_of(tmp_path / "members", "small")
    assert new is not None
    assert new != old
    assert (await chat(url(document, "small"), "small")).status_code == 200


async def test_missing_model_fails_the_load_with_the_servers_own_words(make_driver, tmp_path):
    """A model path that does not exist fails the load at once with llama-server's exit code
    and the log lines naming the file; no process is left."""
    missing = str(tmp_path / "no-such-model.gguf")
    driver, document = make_driver(model_paths={"small": missing})
    with pytest.raises(DriverError, match="exited before ready") as failure:  # not a timeout
        await driver.load("small", epoch=1)
    assert "no-such-model.gguf" in str(failure.value)
    assert await driver.residency() == {"small": False, "large": False}
    assert not port_open(port_of(document, "small"))


async def test_generated_vocabulary_round_trips_newlines_and_any_utf8(make_driver):
    """The generated SentencePiece vocabulary spells a newline and non-ASCII text through its
    byte tokens: llama-server tokenizes and detokenizes them back unchanged."""
    driver, document = make_driver()
    await driver.load("small", epoch=1)
    text = "hello world\nswap the hot seat: é ü 漢字 🙂"
    async with httpx.AsyncClient(timeout=10, trust_env=False) as client:
        tokens = (
            await client.post(f"{url(document, 'small')}/tokenize", json={"content": text})
        ).json()["tokens"]
        back = (
            await client.post(f"{url(document, 'small')}/detokenize", json={"tokens": tokens})
        ).json()["content"]
    assert 0x0A + 3 in tokens  # <0x0A>: byte tokens follow <unk>, <s>, </s>
    assert back.strip() == text
