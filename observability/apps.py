from __future__ import annotations

from typing import Any

from celery.signals import task_prerun
from django.apps import AppConfig
from django.core.signals import request_started

from llm.recording import CallRecord, add_call_observer
from observability.logging import bind_log_context, clear_log_context
from observability.tracing import genai_annotate


class ObservabilityConfig(AppConfig):
    name = "observability"
    verbose_name = "Observability"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Each model call's figures on the current trace span (OpenTelemetry's GenAI attributes).
        def annotate(call: CallRecord) -> None:
            genai_annotate(
                provider=call.provider,
                model=call.model,
                purpose=call.ctx.purpose,
                prompt_tokens=call.prompt_tokens,
                completion_tokens=call.completion_tokens,
                finish_reason=call.finish_reason,
                outcome=call.outcome,
            )

        add_call_observer(annotate)

        # Worker threads and processes are reused: ids bound by one request or task must not
        # show up on the next one's log lines.
        def _request_started(**kwargs: Any) -> None:
            clear_log_context()

        def _task_prerun(task_id: str | None = None, task: Any = None, **kwargs: Any) -> None:
            clear_log_context()
            bind_log_context(task_id=task_id, task=getattr(task, "name", None))

        request_started.connect(_request_started, weak=False, dispatch_uid="observability.clear_log_context")
        task_prerun.connect(_task_prerun, weak=False, dispatch_uid="observability.task_log_context")
