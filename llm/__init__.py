"""The LLM layer: one interface for every model call (replies, streams, structured outputs)."""
