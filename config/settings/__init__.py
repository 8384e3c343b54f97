"""The settings, read from the environment, one module a concern (every variable: docs/configuration.md).

``DJANGO_SETTINGS_MODULE=config.settings`` reads them all, in this order; a later module reads an earlier one's
names from it by name (``from config.settings.site import DATA_DIR``).
"""

from config.settings.api import *  # noqa: F403
from config.settings.background import *  # noqa: F403
from config.settings.database import *  # noqa: F403
from config.settings.extensions import *  # noqa: F403
from config.settings.llm import *  # noqa: F403
from config.settings.memory import *  # noqa: F403
from config.settings.observability import *  # noqa: F403
from config.settings.site import *  # noqa: F403
from config.settings.turns import *  # noqa: F403
