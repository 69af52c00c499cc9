# One command per task; .ci/run and the hooks call these same targets.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: install run test test-unit lint typecheck bench chaos chaos-quick chart clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -c 'import sys; sys.exit("rig-conductor needs Python >= 3.11") if sys.version_info < (3, 11) else None'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

install: $(BIN)/.installed

## The demo: conductor, a live and a dying agent, on embedded Redis and PostgreSQL.
run: install
	$(BIN)/rig-conductor demo

## Unit and integration tests (embedded servers unless RIG_TEST_REDIS_URL / RIG_TEST_DATABASE_URL).
test: install
	$(BIN)/python -m pytest

test-unit: install
	$(BIN)/python -m pytest tests/unit

lint: install
	$(BIN)/ruff check src tests bench migrations
	$(BIN)/ruff format --check src tests bench migrations
	$(BIN)/lint-imports

typecheck: install
	$(BIN)/mypy src

## Benchmarks: each prints its ratios against baselines measured in the same run.
bench: install
	$(BIN)/python bench/reclaim.py
	$(BIN)/python bench/ingest.py
	$(BIN)/python bench/recover.py
	$(BIN)/python bench/recover_live.py
	$(BIN)/python bench/audit.py

## Chaos soak: agents SIGKILLed, the conductor restarted; exit 1 on lost or doubled work.
chaos: install
	$(BIN)/python bench/chaos.py

chaos-quick: install
	$(BIN)/python bench/chaos.py --quick

## Helm chart and Dockerfile checks with the real helm, kubernetes-validate and hadolint.
chart:
	scripts/check-chart.sh

clean:
	rm -rf $(VENV) .cache .mypy_cache .ruff_cache .pytest_cache .hypothesis build dist src/*.egg-info
