"""What the agents app plugs into the layers below it when the app registry is ready (``AgentsConfig.ready``).

The ``llm`` library and the tool registry know no database: they call back. Each callback set here is where a
reader following a model call, a tool call or a workflow lookup goes next:

- every model call is written as an ``LLMCall`` row (``agents.call_records.llm_call_save``), every tool call as
  a ``ToolInvocation`` (``tool_invocation_save``);
- what each endpoint takes for structured outputs is learned by trying and kept in a table (``capability_*``);
- endpoints connected in the admin are provider profiles too (``agents.endpoints.stored_profile``);
- workflows declared in the admin are looked up by name and version (``agents.workflow_store``);
- the offline demo model answers route and workflow decisions for workflows it has no script of its own for.
"""

from __future__ import annotations

from django.db.models.signals import post_delete, post_save

from agents.call_records import capability_load, capability_save, llm_call_save, tool_invocation_save
from agents.endpoints import forget_stored_profiles, stored_profile
from agents.models import EndpointCapability, ModelEndpoint
from agents.routing import RouteDecision, demo_route
from agents.tools.execution import set_invocation_recorder
from agents.tools.registry import default_registry
from agents.workflow_store import StoredWorkflows
from agents.workflows import WorkflowDecision, registered_workflows, set_workflow_source
from agents.workflows.demo import demo_decision, reply_prompt_after, workflow_reply
from llm.capabilities import EndpointKey, forget, install_store
from llm.demo import register_reply_handler, register_reply_prompt_handler, register_structured_handler
from llm.providers import set_profile_source
from llm.recording import set_call_recorder


def connect() -> None:
    """Plug the agents app's callbacks in; build the registries (a bad setting stops the process here)."""
    set_call_recorder(llm_call_save)
    set_invocation_recorder(tool_invocation_save)
    install_store(load=capability_load, save=capability_save)
    set_profile_source(stored_profile)
    post_save.connect(_endpoints_changed, sender=ModelEndpoint, weak=False, dispatch_uid="agents.endpoints_saved")
    post_delete.connect(_endpoints_changed, sender=ModelEndpoint, weak=False, dispatch_uid="agents.endpoints_deleted")
    post_delete.connect(_capability_deleted, sender=EndpointCapability, weak=False, dispatch_uid="agents.capability")
    set_workflow_source(StoredWorkflows())
    # The offline demo model walks a workflow it has no script for from its declaration (its own script wins).
    register_structured_handler(WorkflowDecision, demo_decision)
    register_reply_handler(workflow_reply, fallback=True)
    register_reply_prompt_handler(reply_prompt_after)  # a decision and its reply in one call, as two would give
    register_structured_handler(RouteDecision, demo_route)
    # Built now, so that a bad AGENT_WORKFLOWS / AGENT_TOOLS entry stops the process at start-up with
    # ImproperlyConfigured naming it, instead of failing every page that lists workflows or tools.
    registered_workflows()
    default_registry()


def _endpoints_changed(**_: object) -> None:
    forget_stored_profiles()


def _capability_deleted(instance: EndpointCapability, **_: object) -> None:
    forget(EndpointKey(profile=instance.profile, base_url=instance.base_url, model=instance.model))
