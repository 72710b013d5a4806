"""The router deployment's code, in its layers from the bottom: `scheduling/` (pure decisions, shared
with the simulator), `serving/` (the serving path on Ray, free of HTTP), `api/` (the OpenAI-compatible
HTTP API). Each imports only the ones below it (tests/test_layering.py)."""
