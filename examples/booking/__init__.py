"""The flight-booking demo: a finite-state workflow (``workflow``), two tools (``tools``) and the offline
demo model's script for them (``demo``), plugged in through ``AGENT_WORKFLOWS`` and ``AGENT_TOOLS``."""
