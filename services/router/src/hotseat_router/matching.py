"""Which backends a request may use: rules in order, first match wins, then the default route.

A rule matches when every condition it sets holds: ``models`` (glob patterns on the
request's model), ``headers`` (names case-insensitive, every listed header must carry
exactly the listed value) and ``dataClassification`` (the classification header's value,
case-insensitive, is one of the listed ones). A rule with no condition matches everything.

A request that no rule matches goes to the default route only when its model is one a
rule names (a rule's ``match.models`` matches it; its headers or classification did not
match), or when the config sends every other model there too (``unknownModels:
DefaultRoute``); otherwise there is no route (404 ``model_not_found``).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from hotseat_common.config.model import (
    Backend,
    DefaultRouteStrategy,
    HotseatConfig,
    PoolActivation,
    PriorityHeader,
    Rule,
    UnknownModels,
)

DEFAULT_ROUTE = "defaultRoute"
"""How the default route is named in logs and metrics (the audit event leaves ``rule`` empty)."""


@dataclass(frozen=True, slots=True)
class GroupRoute:
    """A model group named by a rule: one step of the walk, placed by the controller
    (docs/adr/0012) on one of its members' pools."""

    name: str
    backends: Mapping[str, Backend]
    """backend name -> the backend that fronts a member."""


@dataclass(frozen=True, slots=True)
class Route:
    """The matched rule (``None`` for the default route) and its backends in order."""

    rule: str | None
    backends: tuple[Backend, ...]
    """Every backend the route may use, a group's members in the group's place."""
    activation: PoolActivation
    timeout: float | None
    priority: int = 0
    priority_header: PriorityHeader = field(default_factory=PriorityHeader)
    hold_keep_alive: float | None = None
    steps: tuple[Backend | GroupRoute, ...] = ()
    """The walk's steps when the rule names a model group (empty: ``backends``)."""


@dataclass(frozen=True, slots=True)
class _CompiledRule:
    rule: Rule
    models: re.Pattern[str] | None
    headers: tuple[tuple[str, str], ...]
    classifications: frozenset[str]
    route: Route


def _globs(patterns: Iterable[str]) -> re.Pattern[str] | None:
    """One pattern matching any of the globs ``patterns`` (``None`` for none)."""
    translated = [fnmatch.translate(p) for p in patterns]
    return re.compile("|".join(translated)) if translated else None


def _steps(rule: Rule, config: HotseatConfig) -> tuple[Backend | GroupRoute, ...]:
    steps: list[Backend | GroupRoute] = []
    for name in rule.route.backends:
        group = config.group(name)
        if group is not None:
            members = {m.backend: b for m in group.members if (b := config.backend(m.backend))}
            steps.append(GroupRoute(group.name, members))
        elif (backend := config.backend(name)) is not None:
            steps.append(backend)
    return tuple(steps)


def _compile(rule: Rule, config: HotseatConfig) -> _CompiledRule:
    models = _globs(rule.match.models)
    steps = _steps(rule, config)
    backends = tuple(
        b
        for step in steps
        for b in (step.backends.values() if isinstance(step, GroupRoute) else (step,))
    )
    return _CompiledRule(
        rule=rule,
        models=models,
        headers=tuple((k.lower(), v) for k, v in rule.match.headers.items()),
        classifications=frozenset(c.lower() for c in rule.match.data_classification),
        route=Route(
            rule=rule.name,
            backends=backends,
            activation=rule.route.pool_activation,
            timeout=rule.timeout,
            priority=rule.priority,
            priority_header=rule.priority_header,
            hold_keep_alive=rule.hold_keep_alive,
            steps=steps if any(isinstance(s, GroupRoute) for s in steps) else (),
        ),
    )


class Matcher:
    """Routes a request by its model and headers; built once per config."""

    def __init__(self, config: HotseatConfig) -> None:
        self._rules = tuple(_compile(r, config) for r in config.rules)
        self._classification_header = config.router.classification.header_key.lower()
        self._strategy = config.default_route_strategy
        self._default: Route | None = None
        if config.default_route is not None:
            backend = config.backend(config.default_route)
            if backend is not None:
                self._default = _single(backend)
        self._named = _globs(p for rule in config.rules for p in rule.match.models)
        self._unknown_to_default = config.unknown_models is UnknownModels.DEFAULT_ROUTE
        self._by_name: dict[str, Route] = {}
        if self._strategy is DefaultRouteStrategy.BACKEND_NAME_MATCH:
            for backend in config.backends:
                self._by_name.setdefault(backend.name, _single(backend))
            for backend in config.backends:
                if backend.display_name:
                    self._by_name.setdefault(backend.display_name, _single(backend))

    def classification(self, headers: Mapping[str, str]) -> str | None:
        value = headers.get(self._classification_header)
        return value.strip().lower() if value is not None else None

    def named(self, model: str) -> bool:
        """Whether some rule's ``match.models`` matches ``model``."""
        return self._named is not None and self._named.match(model) is not None

    def route(self, model: str, headers: Mapping[str, str]) -> Route | None:
        """The first rule that matches, else (``BackendNameMatch``) the backend the model
        names, else the default route where it applies, else ``None`` (no route)."""
        classification: str | None = None
        for compiled in self._rules:
            if compiled.models is not None and compiled.models.match(model) is None:
                continue
            if any(headers.get(name) != value for name, value in compiled.headers):
                continue
            if compiled.classifications:
                if classification is None:
                    classification = self.classification(headers) or ""
                if classification not in compiled.classifications:
                    continue
            return compiled.route
        named = self._by_name.get(model)
        if named is not None:
            return named
        if self._default is not None and (self._unknown_to_default or self.named(model)):
            return self._default
        return None


def _single(backend: Backend) -> Route:
    return Route(rule=None, backends=(backend,), activation=PoolActivation.WAIT, timeout=None)
