"""The Hotseat image the compose stack runs, in a container of its own (testcontainers,
from the locally built image, no network): an unprivileged user, no build tools, and
every entry point present."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from testcontainers.core.container import DockerContainer

from tests.deploy.compose.conftest import Stack

pytestmark = pytest.mark.timeout(300)

ENTRY_POINTS = ("hotseat", "hotseat-router", "hotseat-controller", "hotseat-audit", "hotseat-sim")
BUILD_TOOLS = ("cc", "gcc", "g++", "c++", "make", "ld", "as")


@pytest.fixture(scope="module")
def shell(stack: Stack) -> Iterator[DockerContainer]:
    """A container of the image that idles, for commands run in it with ``exec``."""
    container = (
        DockerContainer(stack.image)
        .with_command(["python", "-c", "import signal; signal.pause()"])
        .with_kwargs(network_mode="none")
    )
    with container:
        yield container


def run(container: DockerContainer, *argv: str) -> tuple[int, str]:
    result = container.exec(list(argv))
    return result.exit_code, result.output.decode(errors="replace")


def test_runs_as_the_unprivileged_hotseat_user(shell: DockerContainer) -> None:
    """The image's processes run as uid/gid 10001 (hotseat), not root."""
    assert run(shell, "id") == (0, "uid=10001(hotseat) gid=10001(hotseat) groups=10001(hotseat)\n")


def test_has_no_build_tools(shell: DockerContainer) -> None:
    """No compiler, linker or make on the runtime image's PATH, no C headers, and no pip
    or setuptools in Hotseat's environment."""
    script = "; ".join(f"command -v {tool}" for tool in BUILD_TOOLS)
    code, found = run(shell, "sh", "-c", f"{script}; ls /usr/include 2>/dev/null; true")
    assert (code, found) == (0, "")
    probe = "import importlib.util as u; print(u.find_spec('pip'), u.find_spec('setuptools'))"
    code, out = run(shell, "python", "-c", probe)
    assert (code, out) == (0, "None None\n")


def test_every_entry_point_answers(shell: DockerContainer) -> None:
    """Each Hotseat command is installed and prints its usage."""
    for entry_point in ENTRY_POINTS:
        code, out = run(shell, entry_point, "--help")
        assert code == 0, (entry_point, out)
        assert out.startswith("usage:"), (entry_point, out)


def test_bundled_config_is_valid(shell: DockerContainer) -> None:
    """The config the image carries at $HOTSEAT_CONFIG passes `hotseat check-config`."""
    code, out = run(shell, "sh", "-c", 'hotseat check-config "$HOTSEAT_CONFIG"')
    assert code == 0, out
    assert "valid" in out
