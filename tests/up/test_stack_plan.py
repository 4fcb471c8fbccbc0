"""What ``hotseat up`` plans for a config, decided without starting anything."""

from __future__ import annotations

import shlex
from pathlib import Path

from hotseat.audit_cli import DEFAULT_URL as DEFAULT_AUDIT_URL
from hotseat.stack_plan import (
    WarmTarget,
    example_model,
    examples,
    plan_services,
    plan_sims,
    warm_members,
    warm_targets,
)
from hotseat.status_cli import DEFAULT_CONTROLLER_URL
from hotseat_common.config import parse_config


def config(**extra):
    return parse_config(
        {
            "backends": [
                {"name": "a", "address": "http://127.0.0.1:9101", "model": "qwen2.5-3b",
                 "pool": {"name": "gpu0", "member": "a"}},
                {"name": "b", "address": "http://localhost:9102",
                 "pool": {"name": "gpu0", "member": "b"}},
                {"name": "p", "address": "http://127.0.0.1:9103",
                 "pool": {"name": "proc", "member": "p"}},
                {"name": "embed", "address": "http://127.0.0.1:9104"},
                {"name": "cloud", "address": "https://api.example.com", "tier": "cloud"},
                {"name": "tls", "address": "https://127.0.0.1:9105"},
            ],
            "pools": [
                {"name": "gpu0", "default": "b", "driver": {"kind": "sim"},
                 "members": [{"name": "a"}, {"name": "b", "sim": {"loadSeconds": 3}}]},
                {"name": "proc", "driver": {"kind": "process"},
                 "members": [{"name": "p", "process": {"command": ["llama-server"]}}]},
            ],
            "rules": [
                {"name": "any", "match": {"models": ["qwen*"]}, "route": {"backends": ["a"]}},
                {"name": "b", "match": {"models": ["bee"]}, "route": {"backends": ["b"]}},
            ],
            "defaultRoute": "a",
            **extra,
        }
    )  # fmt: skip


def test_sims_for_local_plain_http_backends_only() -> None:
    """Loopback http backends get a sim (unpooled ones loaded); others get a note or nothing."""
    sims, notes = plan_sims(config())
    assert [(s.backend, s.host, s.port, s.loaded) for s in sims] == [
        ("a", "127.0.0.1", 9101, False),
        ("b", "localhost", 9102, False),
        ("embed", "127.0.0.1", 9104, True),
    ]
    assert sims[0].name == "sim-a"
    assert sims[0].url == "http://127.0.0.1:9101"
    assert any("backend p" in n and "process driver" in n for n in notes)
    assert any("backend tls" in n for n in notes)
    assert not any("cloud" in n for n in notes)


def test_services_skip_what_is_not_installed(tmp_path: Path) -> None:
    """Only installed services are planned; the router takes --port, audit gets SQLite."""
    plans, skipped = plan_services(
        {"router": 8181},
        tmp_path,
        available=lambda module: "router" not in module,
        binary=lambda _: True,
    )
    assert [p.name for p in plans] == ["audit", "controller"]
    assert skipped == ["skipping router: hotseat_router.main is not installed yet"]
    audit, controller = plans
    assert audit.extra_args == ("--dsn", f"sqlite:///{tmp_path.resolve() / 'audit.db'}")
    assert controller.uses_redis
    assert controller.extra_args == ("--audit-url", audit.url), "the console's timeline"
    plans, skipped = plan_services({}, tmp_path, available=lambda _: True, binary=lambda _: False)
    assert plans == []
    assert len(skipped) == 3


def test_services_run_on_the_ports_the_commands_default_to_unless_moved(tmp_path: Path) -> None:
    """By default the router on 8080 (the examples' base URL), the controller on 8090
    (``hotseat status``'s default) and audit on 8082 (``hotseat audit``'s), fixed: a port
    given moves a service, 0 picks a free one."""
    plans, notes = plan_services({}, tmp_path, available=lambda _: True, binary=lambda _: True)
    assert {p.name: p.port for p in plans} == {"audit": 8082, "controller": 8090, "router": 8080}
    assert notes == []
    assert DEFAULT_CONTROLLER_URL.endswith(":8090")
    assert DEFAULT_AUDIT_URL.endswith(":8082")
    plans, _ = plan_services(
        {"router": 8181, "controller": 0, "audit": 9182},
        tmp_path,
        available=lambda _: True,
        binary=lambda _: True,
    )
    ports = {p.name: p.port for p in plans}
    assert (ports["router"], ports["audit"]) == (8181, 9182)
    assert ports["controller"] not in {0, 8090, 8181, 9182}


def test_warm_targets_are_what_the_controller_loads_at_start() -> None:
    """Each pool's default and pinned members, with the sims' load time as the expected
    one; a pool with neither is not waited for; others get swapTimeout per member."""
    cfg = parse_config(
        {
            "pools": [
                {"name": "gpu0", "default": "b", "driver": {"kind": "sim"},
                 "members": [{"name": "a"}, {"name": "b", "sim": {"loadSeconds": 3}}]},
                {"name": "cold", "members": [{"name": "c"}]},
                {"name": "big", "default": "x", "capacity": {"gpuMemoryGiB": 48},
                 "members": [{"name": "e", "memoryGiB": 6, "pinned": True,
                              "sim": {"loadSeconds": 1}},
                             {"name": "x", "memoryGiB": 20, "sim": {"loadSeconds": 4}},
                             {"name": "y", "memoryGiB": 20}]},
                {"name": "proc", "default": "p", "swapTimeout": "2m",
                 "driver": {"kind": "process"},
                 "members": [{"name": "p", "process": {"command": ["llama-server"]}}]},
            ],
        }
    )  # fmt: skip
    assert warm_targets(cfg, margin_s=30) == [
        WarmTarget("gpu0", ("b",), 3.0, 33.0),
        WarmTarget("big", ("e", "x"), 5.0, 35.0),
        WarmTarget("proc", ("p",), None, 150.0),
    ]


def test_warm_members_are_sim_pool_defaults() -> None:
    """Without a controller, each sim pool's default member (else its first) is warmed."""
    assert warm_members(config()) == [("gpu0", "b", "b", 3.0)]


def test_example_model_is_a_literal_rule_model() -> None:
    """The example uses a model a rule matches literally, skipping patterns."""
    assert example_model(config()) == "bee"


def test_examples_go_to_the_router_or_a_sim() -> None:
    """With a router the examples target it; without, the loaded sim with its model name."""
    cfg = config()
    sims, _ = plan_sims(cfg)
    text, note = examples(cfg, sims, "http://127.0.0.1:8080", python="/venv/bin/python")
    curl, sdk = (shlex.split(line) for line in text.splitlines()[1:])
    assert curl[:2] == ["curl", "-s"]
    assert curl[2] == "http://127.0.0.1:8080/v1/chat/completions"
    assert '"model": "bee"' in curl[-1]
    assert sdk[:2] == ["/venv/bin/python", "-c"]
    assert 'base_url="http://127.0.0.1:8080/v1"' in sdk[2]
    assert note is None
    text, note = examples(cfg, sims, None, python="python")
    assert "http://127.0.0.1:9104/v1/chat/completions" in text
    assert note is not None
    assert "sim-embed" in note


def test_examples_ask_for_a_key_when_the_router_needs_one() -> None:
    """A router with API keys gets an Authorization header from $HOTSEAT_API_KEY."""
    cfg = config(router={"apiKeys": {"env": "MY_KEYS"}})
    text, note = examples(cfg, [], "http://127.0.0.1:8080", python="python")
    assert "Authorization: Bearer $HOTSEAT_API_KEY" in text
    assert 'os.environ["HOTSEAT_API_KEY"]' in text
    assert note is not None
    assert "HOTSEAT_API_KEY" in note
