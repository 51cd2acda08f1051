"""The admin: changelists render for a superuser, display methods, actions."""

from __future__ import annotations

from django.contrib.admin.sites import site
from django.contrib.auth.models import User
from django.test import TestCase
from django.urls import reverse

from pikku_django.admin import LeaseAdmin, format_ms
from pikku_django.models import Lease
from tests.support.factories import lapse


class LeaseAdminTests(TestCase):
    def setUp(self) -> None:
        self.user = User.objects.create_superuser("admin", "admin@example.com", "pw")
        self.client.force_login(self.user)
        self.live = Lease.objects.acquire("report:live", "worker-1", 60_000)
        Lease.objects.acquire("report:gone", "worker-2", 60_000)
        lapse("report:gone", ago_ms=5_000)
        self.url = reverse("admin:pikku_django_lease_changelist")

    def test_changelist_renders_with_state_and_time_left(self) -> None:
        response = self.client.get(self.url)
        assert response.status_code == 200
        body = response.content.decode()
        assert "report:live" in body and "report:gone" in body
        assert "live" in body and "lapsed" in body
        assert "Expire selected leases" in body

    def test_filter_live_and_lapsed(self) -> None:
        live = self.client.get(self.url, {"state": "live"}).content.decode()
        assert "report:live" in live and "report:gone" not in live
        lapsed = self.client.get(self.url, {"state": "lapsed"}).content.decode()
        assert "report:gone" in lapsed and "report:live" not in lapsed

    def test_search(self) -> None:
        body = self.client.get(self.url, {"q": "worker-2"}).content.decode()
        assert "report:gone" in body and "report:live" not in body

    def test_change_page_is_read_only(self) -> None:
        url = reverse("admin:pikku_django_lease_change", args=["report:live"])
        response = self.client.get(url)
        assert response.status_code == 200
        assert b'name="holder"' not in response.content
        assert self.client.get(reverse("admin:pikku_django_lease_add")).status_code == 403
        delete = reverse("admin:pikku_django_lease_delete", args=["report:live"])
        assert self.client.post(delete, {"post": "yes"}).status_code == 403
        assert Lease.objects.filter(key="report:live").exists()

    def test_expire_action_lapses_without_lowering_token(self) -> None:
        response = self.client.post(
            self.url,
            {"action": "expire_leases", "_selected_action": ["report:live", "report:gone"]},
            follow=True,
        )
        assert response.status_code == 200
        assert "Expired 1 lease." in response.content.decode()
        assert Lease.objects.current("report:live") is None
        assert Lease.objects.get(key="report:live").token == self.live.token
        assert Lease.objects.refresh(self.live, 60_000) is None
        assert Lease.objects.acquire("report:live", "worker-3", 60_000).token == self.live.token + 1

    def test_changelist_query_count_is_bounded(self) -> None:
        for i in range(30):
            Lease.objects.acquire(f"bulk:{i}", "w", 60_000)
        self.client.get(self.url)  # warm caches (content types, sessions)
        with self.assertNumQueries(5):
            self.client.get(self.url)

    def test_display_methods(self) -> None:
        model_admin = LeaseAdmin(Lease, site)
        lease = Lease.objects.get(key="report:live")  # not annotated: reads the DB clock
        assert model_admin.state(lease) == "live"
        assert model_admin.time_left(lease).endswith(" s")
        gone = Lease.objects.get(key="report:gone")
        assert model_admin.state(gone) == "lapsed"
        assert model_admin.time_left(gone) == model_admin.get_empty_value_display()
        assert model_admin.expires_display(lease) == lease.expires

    def test_format_ms(self) -> None:
        assert format_ms(950) == "950 ms"
        assert format_ms(12_340) == "12.3 s"
        assert format_ms(245_000) == "4 min 5 s"
        assert format_ms(7_380_000) == "2 h 3 min"
