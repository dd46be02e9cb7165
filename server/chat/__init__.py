"""`POST /v1/chat/completions`: wire models (protocol), logic (serving), routing (api_router)."""
