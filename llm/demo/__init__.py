"""The offline demo model: deterministic, no network, and always labelled "demo model, not an LLM".

It lets the whole machinery (context, memory, state, tools) run and be seen on a fresh machine
with no model configured. It does not reason: replies are extractive (quoted from what it was
given), summaries keep the sentences that carry facts, and structured requests get a valid
instance. Other parts of the app teach it their domain through a small registry:

- ``register_structured_handler(schema, fn)``: ``fn(messages)`` returns an instance of ``schema``
  (or ``None`` to decline); used for that schema and its subclasses.
- ``register_reply_prompt_handler(fn)``: for a structured reply (decision first, then the reply's text),
  ``fn(messages, decision)`` returns the messages of the reply that follows the decision (or ``None``);
- ``register_reply_handler(fn)``: ``fn(messages, tools)`` returns a ``DemoReply`` (or ``None``);
  handlers are tried in registration order and the first answer wins; ``fallback=True`` ones (the generic
  workflow reply) after all the others.

A structured handler that serves many schemas reads the one asked for with ``requested_schema()``. The default
reply quotes what it was given, never the machine lines of a prompt (``WORKFLOW: …``, ``COLLECTED: …``).

Its modules:
- ``model``: ``DemoModel``, the provider, and its word-sized stream;
- ``registry``: its names and label, ``DemoReply`` and the handlers other apps register;
- ``reading``: a message's text, sentences and keywords; whether the user asks for a person;
- ``replies``: the hand-off, the handlers' answer, the default reply;
- ``summaries``: the extractive summary;
- ``structured``: a handler's instance, else a generic one built from the schema.
"""

from llm.demo.model import DemoModel, word_chunks
from llm.demo.reading import asks_for_person, split_sentences
from llm.demo.registry import (
    DEMO_LABEL,
    DEMO_MODEL_NAME,
    DEMO_REPLY_PREFIX,
    DemoReply,
    ReplyHandler,
    ReplyPromptHandler,
    StructuredHandler,
    register_reply_handler,
    register_reply_prompt_handler,
    register_structured_handler,
    requested_schema,
    unregister_reply_handler,
    unregister_structured_handler,
)
from llm.demo.replies import default_reply, demo_reply
from llm.demo.structured import generic_instance, structured_instance
from llm.demo.summaries import extractive_summary

__all__ = [
    "DEMO_LABEL",
    "DEMO_MODEL_NAME",
    "DEMO_REPLY_PREFIX",
    "DemoModel",
    "DemoReply",
    "ReplyHandler",
    "ReplyPromptHandler",
    "StructuredHandler",
    "asks_for_person",
    "default_reply",
    "demo_reply",
    "extractive_summary",
    "generic_instance",
    "register_reply_handler",
    "register_reply_prompt_handler",
    "register_structured_handler",
    "requested_schema",
    "split_sentences",
    "structured_instance",
    "unregister_reply_handler",
    "unregister_structured_handler",
    "word_chunks",
]
