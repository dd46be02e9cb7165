"""The OpenAI-compatible adaptive Best-of-N gateway (uses `stoppers` and `reward`)."""
