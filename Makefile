# One-word commands for developers; see DEVELOPERS.md. `make ci` is what CI runs.

VENV ?= .venv
PY := $(VENV)/bin/python
PG_URL ?= postgres://postgres@127.0.0.1:5432/test
MARIADB_URL ?= mysql://root@127.0.0.1:3306/test
# Extra pytest arguments, e.g. make test-sqlite ARGS="-k hold_lease -x" (ARGS="-n 0": serially)
ARGS ?=
# The tests that stop and start the server: alone, serially (see tests/conftest.py).
RESTARTS := -n 0 -m restarts_server

.PHONY: venv services test test-sqlite test-postgres test-mariadb test-restarts lint format-check ci

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

# The parallel runs above leave out the server-restart tests: these run them.
test-restarts: $(PY)
	DATABASE_URL=$(PG_URL) $(PY) -m pytest $(RESTARTS) $(ARGS)
	DATABASE_URL=$(MARIADB_URL) $(PY) -m pytest $(RESTARTS) $(ARGS)

test: test-sqlite test-postgres test-mariadb test-restarts

lint: $(PY)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy pikku_django testproject
	$(PY) manage.py check --fail-level WARNING
	$(PY) manage.py makemigrations --check --dry-run

# CI runs it too (.ci/run's checks); `ruff format .` fixes what it shows.
format-check: $(PY)
	$(VENV)/bin/ruff format --check .

ci:
	bash .ci/run
