"""
The runs list for safe deploys: filters by code version, by "holds patch X"
(a choice per patch name) and the parked runs; a run's page shows its
versions and markers; "Retry selected runs" revives a parked run.
"""

from __future__ import annotations

from django.contrib.auth.models import User
from django.test import TestCase
from django.urls import reverse

from pikku_django.admin.deploys import code_patch_names
from pikku_django.managers.versions import code_version
from pikku_django.models import WorkflowPatch, WorkflowRun
from pikku_django.workflows import start_workflow


class DeploysAdminTests(TestCase):
    def setUp(self) -> None:
        self.client.force_login(User.objects.create_superuser("admin", "admin@example.com", "pw"))
        self.url = reverse("admin:pikku_django_workflowrun_changelist")
        self.old = start_workflow("test.noop")
        self.new = start_workflow("test.noop")
        WorkflowRun.objects.filter(pk=self.old.pk).update(code_version="release-1")
        WorkflowRun.objects.filter(pk=self.new.pk).update(code_version="release-2", has_patches=True)
        WorkflowPatch.objects.create(run=self.new, name="tax-v2", created_at=self.new.created_at)

    def listed(self, query: str) -> set[str]:
        response = self.client.get(f"{self.url}?{query}")
        assert response.status_code == 200
        return {str(run.pk) for run in response.context["cl"].result_list}

    def test_filter_by_code_version(self) -> None:
        page = self.client.get(self.url).content.decode()
        assert "code version" in page and "?code_version=this" in page and "?code_version=other" in page
        assert self.listed("code_version=release-1") == {str(self.old.pk)}
        assert self.listed("code_version=release-2") == {str(self.new.pk)}
        current = start_workflow("test.noop")
        assert current.code_version == code_version("test.noop") != ""
        assert self.listed("code_version=this") == {str(current.pk)}
        assert self.listed("code_version=other") == {str(self.old.pk), str(self.new.pk)}

    def test_filter_by_patch_held(self) -> None:
        page = self.client.get(self.url).content.decode()
        assert "holds patch" in page and "?patch=tax-v2" in page
        assert self.listed("patch=tax-v2") == {str(self.new.pk)}
        assert self.listed("patch=other") == set()
        # The choices are the patches the workflows' code names, read from its source.
        assert "tax-v2" in code_patch_names()

    def test_parked_runs_are_one_filter_away_and_retried_from_the_list(self) -> None:
        error = {"type": "pikku_django.errors.WorkflowReplayError", "message": "no fit"}
        WorkflowRun.objects.filter(pk=self.old.pk).update(status="suspended", wake_at=None, error=error)
        assert self.listed("status=parked") == {str(self.old.pk)}
        response = self.client.post(
            self.url, {"action": "retry_runs", "_selected_action": [str(self.old.pk)]}, follow=True
        )
        assert "Retried 1 run" in response.content.decode()
        old = WorkflowRun.objects.get(pk=self.old.pk)
        assert (old.status, old.error) == ("running", None)

    def test_a_run_s_page_shows_its_versions_and_markers(self) -> None:
        page = self.client.get(reverse("admin:pikku_django_workflowrun_change", args=[self.new.pk]))
        text = page.content.decode().lower()
        assert "release-2" in text and "tax-v2" in text and "holds patches" in text
