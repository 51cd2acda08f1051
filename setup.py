from __future__ import annotations

from pathlib import Path

from setuptools import find_packages, setup

setup(
    name="pikku-django",
    version="0.1.0",
    description="Durable leases and workflow steps for Django, judged on the database's clock.",
    long_description=Path(__file__).with_name("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="MIT",
    packages=find_packages(include=["pikku_django", "pikku_django.*"]),
    package_data={"pikku_django": ["py.typed"]},
    python_requires=">=3.10",
    install_requires=["Django>=5.2,<7"],
    extras_require={
        "postgres": ["psycopg[binary]>=3.1"],
        "mysql": ["mysqlclient>=2.2"],
        # The Tasks framework for Django 5.2 (Django 6 has it as django.tasks,
        # which pikku_django.tasks uses there instead).
        "tasks": ["django-tasks>=0.12"],
        # The Prometheus endpoint (pikku_django.urls' metrics/): pikku_django.metrics.
        "metrics": ["prometheus-client>=0.20"],
        # OpenTelemetry spans of enqueues, passes and attempts: pikku_django.otel.
        "otel": ["opentelemetry-api>=1.20"],
        # What testproject/ (the demo) needs beside Django.
        "demo": ["django-environ>=0.11"],
        # Nothing compiled: the SQLite run needs no more. The MariaDB run adds "mysql".
        "test": [
            "pytest>=8",
            "pytest-django>=4.9",
            # The suite runs in parallel (-n in pyproject.toml).
            "pytest-xdist>=3.8",
            "django-environ>=0.11",
            "hypothesis>=6",
            "psycopg[binary]>=3.1",
            # The Tasks tests on Django 5.2 (unused on Django 6, which has django.tasks).
            "django-tasks>=0.12",
            # The metrics and otel extras' tests, the spans read by the SDK's in-memory exporter.
            "prometheus-client>=0.20",
            "opentelemetry-api>=1.20",
            "opentelemetry-sdk>=1.20",
        ],
        # Pinned: a new ruff or mypy release must not turn CI red on its own.
        "dev": ["ruff==0.17.6", "mypy==2.4.1", "django-stubs==6.1.2"],
    },
    # Exactly what .ci/run runs (it checks): Django 5.2 on Python 3.11, and the
    # newest Django 6.x on Python 3.12.
    classifiers=[
        "Development Status :: 3 - Alpha",
        "Framework :: Django",
        "Framework :: Django :: 5.2",
        "Framework :: Django :: 6.1",
        "Intended Audience :: Developers",
        "License :: OSI Approved :: MIT License",
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Typing :: Typed",
    ],
)
