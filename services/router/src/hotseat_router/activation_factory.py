"""Which :class:`ActivationClient` the router uses: the one line to change when the
pool controller's NATS client is plugged in.

If the returned client is also an async context manager, the router's lifespan enters
it (start renewal loops, subscriptions) and exits it on shutdown.
"""

from __future__ import annotations

from nats.aio.client import Client as NatsClient

from hotseat_common.config.model import HotseatConfig
from hotseat_router.activation import ActivationClient, DirectActivation
from hotseat_router.settings import RouterSettings


def build_activation(
    settings: RouterSettings,  # noqa: ARG001 - the controller's client will read them
    nc: NatsClient,  # noqa: ARG001
    config: HotseatConfig,  # noqa: ARG001
) -> ActivationClient:
    """Until the pool controller's client lands, every pooled backend dispatches directly."""
    return DirectActivation()
