"""Hotseat sim backend: a simulated llama.cpp-like inference server with a shared GPU ledger.

The sim serves the OpenAI API (chat, completions, embeddings, models), llama.cpp's
``/health`` and ``/slots``, and a control API (``/control/load``, ``/control/unload``,
``/control/state``) that the controller's ``sim`` residency driver drives. Loads are
admitted against a simulated GPU's memory in Redis, so two residents on one GPU show up
as an out-of-memory failure and in the residency timeline (:mod:`hotseat_sim.timeline`).
"""

__all__: list[str] = []
