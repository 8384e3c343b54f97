"""Workflows an operator declares in the admin (``WorkflowDefinition``), served to the workflow registry.

The agents app installs ``StoredWorkflows`` as the registry's source (``agents.workflows.set_workflow_source``):
a name no code or package registered is looked up here. Each saved change of a definition is a new
``WorkflowVersion``; a session keeps the version it started on, so an edit never changes a running
conversation. Versions never change once written, so each is built once per process.
"""

from __future__ import annotations

import threading

from django.db import transaction
from django.db.models import F

from agents.models import WorkflowDefinition, WorkflowVersion
from agents.tools.registry import tool_names
from agents.workflows import Workflow
from agents.workflows.spec import workflow_from_spec

_built: dict[int, Workflow] = {}  # by WorkflowVersion id
_lock = threading.Lock()


class StoredWorkflows:
    """The registry's source for workflows stored in the database."""

    def workflow(self, name: str, version: int | None) -> Workflow | None:
        """Version ``version`` of the stored workflow ``name`` (None: its latest), or None when there is none.

        One indexed lookup of the version's id; the workflow is built once per version row and process (a
        name deleted and declared again gets new rows, so its old versions are never served for it)."""
        rows = WorkflowVersion.objects.filter(definition__name=name)
        if version is None:
            rows = rows.filter(version=F("definition__version"))
        else:
            rows = rows.filter(version=version)
        found = rows.values_list("pk", "version").first()
        if found is None:
            return None
        pk, number = found
        with _lock:
            cached = _built.get(pk)
        if cached is not None:
            return cached
        spec = WorkflowVersion.objects.filter(pk=pk).values_list("spec", flat=True).first()
        if spec is None:
            return None
        workflow = workflow_from_spec(name, spec)  # tools are checked when a version is saved, not here
        workflow.version = int(number)
        with _lock:
            _built[pk] = workflow
        return workflow

    def choices(self) -> list[tuple[str, str]]:
        """(name, title) of the active stored workflows that have a version."""
        rows = WorkflowDefinition.objects.filter(is_active=True, version__gt=0).values_list("name", "spec")
        return [(name, str((spec or {}).get("title") or name)) for name, spec in rows]


def workflow_definition_save(*, definition: WorkflowDefinition) -> WorkflowDefinition:
    """Check ``definition``'s declaration (``WorkflowSpecError`` says what is wrong) and save it; a changed
    declaration becomes a new version, which new sessions start on (running ones keep theirs)."""
    workflow_from_spec(definition.name, definition.spec, tools=tool_names())
    with transaction.atomic():
        latest = None
        if definition.pk is not None:
            current = WorkflowDefinition.objects.select_for_update().get(pk=definition.pk)
            definition.version = current.version
            latest = (
                WorkflowVersion.objects.filter(definition=current, version=current.version)
                .values_list("spec", flat=True)
                .first()
            )
        if latest != definition.spec:
            definition.version += 1
        definition.save()
        if latest != definition.spec:
            WorkflowVersion.objects.create(definition=definition, version=definition.version, spec=definition.spec)
    return definition
