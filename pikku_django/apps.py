from __future__ import annotations

from django.apps import AppConfig
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
