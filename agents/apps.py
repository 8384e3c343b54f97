from __future__ import annotations

from django.apps import AppConfig


class AgentsConfig(AppConfig):
    name = "agents"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The llm library records each model call through a callback; this one writes an LLMCall row.
        from agents.call_records import capability_load, capability_save, llm_call_save, tool_invocation_save
        from agents.llm.capabilities import install_store
        from agents.llm.demo import register_structured_handler
        from agents.llm.recording import set_call_recorder
        from agents.tools.registry import default_registry, set_invocation_recorder
        from agents.workflow_store import StoredWorkflows
        from agents.workflows import WorkflowDecision, registered_workflows, set_workflow_source
        from agents.workflows.base import demo_decision

        set_call_recorder(llm_call_save)
        set_invocation_recorder(tool_invocation_save)
        # What each endpoint takes for structured outputs, learned by trying, kept in a table.
        install_store(load=capability_load, save=capability_save)
        # Workflows operators declare in the admin, looked up by name and version.
        set_workflow_source(StoredWorkflows())
        # The offline demo model stays in the current state of a workflow it has no script for.
        register_structured_handler(WorkflowDecision, demo_decision)
        # Built now, so that a bad AGENT_WORKFLOWS / AGENT_TOOLS entry stops the process at start-up with
        # ImproperlyConfigured naming it, instead of failing every page that lists workflows or tools.
        registered_workflows()
        default_registry()
