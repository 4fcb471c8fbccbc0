"""``make compose-test``: compose.yaml built and run under a real Docker engine on a
machine that reaches no image registry, then checked the way a user would check it.

- :mod:`~deploy.compose_test.host`: the build machine's Debian mirror, PyPI index and CA
  bundle, handed to the image builds; missing tools installed with apt-get.
- :mod:`~deploy.compose_test.engine`: the engine that answers, or a private dockerd.
- :mod:`~deploy.compose_test.images`: the Compose v2 plugin, the debootstrapped Debian
  base and the stand-ins for the public images (deploy/standins).
- :mod:`~deploy.compose_test.stack`: ports and files of the loopback override
  (deploy/compose/loopback.yaml) and the ``docker compose`` commands.
- ``__main__``: the phases, timed. The checks themselves are tests/deploy/compose.
"""
