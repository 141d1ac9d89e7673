"""Recording proxies: OpenAI-compatible pass-throughs in front of a user's llama-server (``xover record``)."""
