from __future__ import annotations

from django.apps import AppConfig
from django.db.models.signals import post_delete, post_save


class AgentsConfig(AppConfig):
    name = "agents"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The llm library records each model call through a callback; this one writes an LLMCall row.
        from agents.call_records import capability_load, capability_save, llm_call_save, tool_invocation_save
        from agents.endpoints import forget_stored_profiles, stored_profile
        from agents.models import EndpointCapability, ModelEndpoint
        from agents.routing import RouteDecision, demo_route
        from agents.tools.execution import set_invocation_recorder
        from agents.tools.registry import default_registry
        from agents.workflow_store import StoredWorkflows
        from agents.workflows import WorkflowDecision, registered_workflows, set_workflow_source
        from agents.workflows.demo import demo_decision, workflow_reply
        from llm.capabilities import EndpointKey, forget, install_store
        from llm.demo import register_reply_handler, register_structured_handler
        from llm.providers import set_profile_source
        from llm.recording import set_call_recorder

        set_call_recorder(llm_call_save)
        set_invocation_recorder(tool_invocation_save)
        # What each endpoint takes for structured outputs, learned by trying, kept in a table.
        install_store(load=capability_load, save=capability_save)
        # Endpoints connected in the admin are profiles too (the environment's win over one of the same name).
        set_profile_source(stored_profile)
        post_save.connect(lambda **_: forget_stored_profiles(), sender=ModelEndpoint, weak=False)
        post_delete.connect(lambda **_: forget_stored_profiles(), sender=ModelEndpoint, weak=False)

        def capability_deleted(instance: EndpointCapability, **_: object) -> None:
            forget(EndpointKey(profile=instance.profile, base_url=instance.base_url, model=instance.model))

        post_delete.connect(capability_deleted, sender=EndpointCapability, weak=False)
        # Workflows operators declare in the admin, looked up by name and version.
        set_workflow_source(StoredWorkflows())
        # The offline demo model walks a workflow it has no script for from its declaration (its own script wins).
        register_structured_handler(WorkflowDecision, demo_decision)
        register_reply_handler(workflow_reply, fallback=True)
        register_structured_handler(RouteDecision, demo_route)
        # Built now, so that a bad AGENT_WORKFLOWS / AGENT_TOOLS entry stops the process at start-up with
        # ImproperlyConfigured naming it, instead of failing every page that lists workflows or tools.
        registered_workflows()
        default_registry()
