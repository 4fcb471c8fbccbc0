"""tests/deploy/compose runs only against a stack that ``make compose-test`` started (it
sets ``HOTSEAT_COMPOSE_TEST_STACK``); a plain ``make test`` does not collect it."""

from __future__ import annotations

import os

collect_ignore = [] if os.environ.get("HOTSEAT_COMPOSE_TEST_STACK") else ["compose"]
