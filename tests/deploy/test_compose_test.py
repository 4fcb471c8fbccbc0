"""The parts of ``make compose-test`` that need no engine: the loopback override covers
compose.yaml, the rendered config and nginx.conf point every service at its loopback
port, and the build machine's apt and pip settings are read as apt and pip read them."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from deploy.checks.compose import load, merge, plain
from deploy.compose_test import images, stack
from deploy.compose_test.host import AptSource, apt_sources, pip_build_args

from hotseat_common.config import load_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ports() -> dict[str, int]:
    return stack.choose_ports()


@pytest.fixture(scope="module")
def env(ports: dict[str, int], tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("loopback")
    return stack.environment(out, ports, images.STANDIN_IMAGES, {})


def merged() -> dict[str, dict[str, object]]:
    base, override = (load(ROOT / name) for name in stack.FILES)
    services: dict[str, dict[str, object]] = merge(plain(base), override)["services"]
    return services


def test_choose_ports_gives_each_name_its_own_port(ports: dict[str, int]) -> None:
    """Every port the override reads gets a distinct one."""
    assert set(ports) == set(stack.PORTS)
    assert len(set(ports.values())) == len(stack.PORTS)


def test_every_service_runs_on_the_host_network_and_publishes_nothing() -> None:
    """Each service of compose.yaml is on the host's network in the override, with no
    published port and no network of its own."""
    base = plain(load(ROOT / "compose.yaml"))["services"]
    services = merged()
    assert set(services) == set(base)
    for name, service in services.items():
        assert service.get("network_mode") == "host", name
        assert "ports" not in service, name
        assert "networks" not in service, name


def test_hotseat_services_listen_on_loopback_at_their_own_port() -> None:
    """Every Hotseat service binds 127.0.0.1 and reads NATS and Redis there; the replicas
    of one service get different ports."""
    services = merged()
    hotseat = {n: s for n, s in services.items() if "build" in s}
    assert len(hotseat) == 7
    seen: set[str] = set()
    for name, service in hotseat.items():
        environment = service["environment"]
        assert isinstance(environment, dict)
        assert environment["HOTSEAT_HOST"] == "127.0.0.1", name
        assert environment["HOTSEAT_NATS_URL"].startswith("nats://127.0.0.1:"), name
        assert environment["HOTSEAT_REDIS_URL"].startswith("redis://127.0.0.1:"), name
        command = service["command"]
        assert isinstance(command, list)
        port = command[command.index("--port") + 1] if "--port" in command else None
        listen = port or environment["HOTSEAT_PORT"]
        assert listen == f"${{{stack.port_variable(name)}:?}}", (name, listen)
        assert listen not in seen
        seen.add(listen)


def test_every_variable_of_the_override_is_set(env: dict[str, str]) -> None:
    """The compose test sets each variable the override requires (`${NAME:?}`)."""
    text = (ROOT / "deploy/compose/loopback.yaml").read_text()
    required = set(re.findall(r"\$\{(\w+):\?\}", text))
    used = set(re.findall(r"\$\{(\w+)", text))
    assert required
    assert required <= set(env), required - set(env)
    optional = used - required - set(env)
    assert optional == {"HOTSEAT_POSTGRES_PASSWORD"}  # compose.yaml's own default applies


def test_render_points_backends_and_upstreams_at_their_ports(
    tmp_path: Path, ports: dict[str, int]
) -> None:
    """The rendered Hotseat config is valid and sends each backend to its sim's port; the
    rendered nginx.conf listens on the gateway's port and proxies to both routers'."""
    stack.render(tmp_path, ports)
    config = load_config(tmp_path / "hotseat.yaml")
    addresses = {b.name: urlsplit(b.address) for b in config.backends}
    assert {n: (a.hostname, a.port) for n, a in addresses.items()} == {
        "assistant": ("127.0.0.1", ports["sim-assistant"]),
        "coder": ("127.0.0.1", ports["sim-coder"]),
    }
    nginx = (tmp_path / "nginx.conf").read_text()
    assert re.findall(r"server (\S+) max_fails", nginx) == [
        f"127.0.0.1:{ports['router-1']}",
        f"127.0.0.1:{ports['router-2']}",
    ]
    assert re.findall(r"listen (\S+);", nginx) == [f"127.0.0.1:{ports['gateway']}"]


def test_render_refuses_a_service_without_a_port(tmp_path: Path, ports: dict[str, int]) -> None:
    """A backend on a service the override gives no port fails the render, naming it."""
    root = tmp_path / "repo"
    shutil.copytree(ROOT / "deploy/compose", root / "deploy/compose")
    config = root / "deploy/compose/hotseat.yaml"
    config.write_text(config.read_text().replace("sim-coder:9102", "sim-embed:9103"))
    with pytest.raises(stack.RenderError, match="sim-embed"):
        stack.render(tmp_path / "out", ports, root)


def test_apt_sources_reads_one_line_and_deb822_files(tmp_path: Path) -> None:
    """Enabled `deb` entries of the bookworm suites are found in both formats; options,
    comments, other suites and `deb-src` are left out."""
    (tmp_path / "sources.list").write_text(
        "deb [arch=amd64 signed-by=/k.gpg] http://mirror.test/debian/ bookworm main contrib\n"
        "# deb http://commented.test/debian bookworm main\n"
        "deb-src http://mirror.test/debian bookworm main\n"
        "deb http://other.test/apt stable main\n"
    )
    listed = tmp_path / "sources.list.d"
    listed.mkdir()
    (listed / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.test/debian-security\nSuites: bookworm-security\n"
        "Components: main\n\n"
        "Types: deb\nURIs: http://off.test/debian\nSuites: bookworm\nComponents: main\n"
        "Enabled: no\n"
    )
    assert apt_sources([tmp_path / "sources.list", listed]) == (
        AptSource("http://mirror.test/debian", "bookworm", ("main", "contrib")),
        AptSource("http://mirror.test/debian-security", "bookworm-security", ("main",)),
    )


def test_pip_build_args_pass_network_indexes_only() -> None:
    """An image build gets the host's HTTP(S) indexes and trusted hosts, never a local
    `file:` index it cannot read."""
    config = {
        "index-url": "https://pypi.mirror.test/simple",
        "extra-index-url": "file:///srv/wheels https://extra.test/simple",
        "trusted-host": "pypi.mirror.test",
    }
    assert pip_build_args(config) == {
        "PIP_INDEX_URL": "https://pypi.mirror.test/simple",
        "PIP_EXTRA_INDEX_URL": "https://extra.test/simple",
        "PIP_TRUSTED_HOST": "pypi.mirror.test",
    }
    assert pip_build_args({"extra-index-url": "file:///srv/wheels", "trusted-host": "x"}) == {}
