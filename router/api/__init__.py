"""The OpenAI-compatible HTTP API: routes, protocol models, validation, auth and response headers."""
