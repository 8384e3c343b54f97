"""The OpenAI-compatible door (``/v1/chat/completions``, ``/v1/models``): docs/openai-compatible.md."""
