"""Which :class:`~.protocol.ActivationClient` the router uses.

With pools in the config, pooled backends ask the pool controller over NATS for an
activation lease; without pools there is nothing to activate and dispatch is direct.
The returned client is an async context manager when it needs starting (the router's
lifespan enters it: subscriptions, renewal loops).
"""

from __future__ import annotations

from nats.aio.client import Client as NatsClient

from hotseat_common.config.model import HotseatConfig
from hotseat_common.subjects import Subjects
from hotseat_common.tracing import NO_TRACING, Tracing
from hotseat_router.activation.direct import DirectActivation
from hotseat_router.activation.nats import NatsActivationClient
from hotseat_router.activation.protocol import ActivationClient
from hotseat_router.settings import RouterSettings, router_name


def build_activation(
    settings: RouterSettings,
    nc: NatsClient,
    config: HotseatConfig,
    tracing: Tracing = NO_TRACING,
) -> ActivationClient:
    if not config.pools:
        return DirectActivation()
    return NatsActivationClient(
        nc, Subjects(settings.subject_prefix), router_name(settings, config), tracing=tracing
    )
