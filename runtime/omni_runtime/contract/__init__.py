"""The runtime's contract layer: the vocabulary every other layer speaks (no torch, no FastAPI).

- ``stages``: the stage names, the pipeline variants and the one stage graph (the operator's
  planner derives its graph from it too);
- ``engine``: what the API asks of an engine (request, events, errors, stats, the ``Engine``
  protocol);
- ``options``: the options an engine is built from (the ``omni serve`` / ``omni stage`` flags);
- ``adapter``: what the pipeline asks of a model family (prompt types, runner protocols,
  ``OmniAdapter``);
- ``sessions``: session ids that name their worker.
"""
