from __future__ import annotations

from django.apps import AppConfig
from django.conf import settings
from django.utils.module_loading import autodiscover_modules


class PikkuConfig(AppConfig):
    name = "pikku_django"
    label = "pikku_django"
    verbose_name = "Pikku leases and workflows"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from pikku_django import checks  # noqa: F401  (registers the checks)

        # Like the admin with admin.py: every installed app's workflows.py is
        # imported, so a worker process knows every @workflow.
        autodiscover_modules("workflows")
        # The workflow that runs Django Tasks, where TASKS names this app's
        # backend (its module needs django.tasks, or the backport on 5.2).
        backends = getattr(settings, "TASKS", None) or {}
        if any(str(config.get("BACKEND", "")).startswith("pikku_django.") for config in backends.values()):
            from pikku_django.tasks import runner  # noqa: F401  (registers the workflow)
