"""What Django's debug error page and error e-mails may show of the settings.

Django hides settings whose names look secret (``KEY``, ``PASS``, ``TOKEN`` …), but not URLs, and this
app keeps credentials in URLs: ``DATABASE_URL``, ``REDIS_URL``, ``CELERY_BROKER_URL`` and a webhook's
``ALERT_WEBHOOK_URL`` (Slack puts its token in the path). With ``DEBUG`` on (the local default), any
unexpected error in a page would print them.
"""

from __future__ import annotations

import re

from django.views.debug import SafeExceptionReporterFilter


class SettingsFilter(SafeExceptionReporterFilter):
    # Django's own list (API, AUTH — the Authorization header —, TOKEN, KEY, SECRET, PASS …) plus ours.
    hidden_settings = re.compile(
        SafeExceptionReporterFilter.hidden_settings.pattern + r"|URL|DSN|BROKER|ENDPOINT|PROFILES", flags=re.IGNORECASE
    )
