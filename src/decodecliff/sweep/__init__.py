"""Context sweeps: streaming client, exact-length prompts, chunked runs with timeouts."""
