from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from testproject.demo import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("pikku/", include("pikku_django.urls")),
    path("imports/<uuid:run_id>/", views.import_page, name="import-page"),
    path("imports/<uuid:run_id>/log", views.import_log, name="import-log"),
]
