# One-word commands for developers; see DEVELOPERS.md. `make ci` is what CI runs.

VENV ?= .venv
PY := $(VENV)/bin/python
PG_URL ?= postgres://postgres@127.0.0.1:5432/test
MARIADB_URL ?= mysql://root@127.0.0.1:3306/test
# Extra pytest arguments, e.g. make test-sqlite ARGS="-k hold_lease -x"
ARGS ?=

.PHONY: venv services test test-sqlite test-postgres test-mariadb lint format-check ci

# `make venv` (re)installs into an existing .venv too; the test targets only
# need one to exist.
venv:
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check -q -e '.[test,dev,mysql]' 'Django>=5.2,<6'

$(PY):
	$(MAKE) venv

services:
	bash .ci/run --services-only

test-sqlite: $(PY)
	env -u DATABASE_URL $(PY) -m pytest $(ARGS)

test-postgres: $(PY)
	DATABASE_URL=$(PG_URL) $(PY) -m pytest $(ARGS)

test-mariadb: $(PY)
	DATABASE_URL=$(MARIADB_URL) $(PY) -m pytest $(ARGS)

test: test-sqlite test-postgres test-mariadb

lint: $(PY)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy pikku_django testproject
	$(PY) manage.py check --fail-level WARNING
	$(PY) manage.py makemigrations --check --dry-run

# Not in CI yet (see DEVELOPERS.md).
format-check: $(PY)
	$(VENV)/bin/ruff format --check .

ci:
	bash .ci/run
