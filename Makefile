# One command per task; .ci/run and the hooks call these same targets.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

RUNS ?= 10
# pytest-xdist workers for the test targets (tests/distribution.py: which worker runs what).
# Most tests wait on servers and timers, so three share two cores well; WORKERS=0 runs serially.
WORKERS ?= 3
XDIST = -n $(WORKERS)

AGENT ?= python

.PHONY: conformance conformance-broken ts docs docs-serve docs-ref install run test test-unit test-servers flake test-install image test-image test-upgrade release check-release lint typecheck bench chaos chaos-quick chart lock clean

$(BIN)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -c 'import sys; sys.exit("rig-conductor needs Python >= 3.11") if sys.version_info < (3, 11) else None'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $@

install: $(BIN)/.installed

## The demo on embedded Redis and PostgreSQL: a reclaim, then a live console until Ctrl-C.
run: install
	$(BIN)/rig-conductor demo

## Unit and integration tests (embedded servers unless RIG_TEST_REDIS_URL / RIG_TEST_DATABASE_URL).
test: install
	$(BIN)/python -m pytest $(XDIST) --ignore=tests/install --ignore=tests/image --ignore=tests/chart \
	  --ignore=tests/release --ignore=tests/upgrade

## The wheel installed without extras into a fresh venv, then its commands (slow: downloads).
test-install: install
	$(BIN)/python -m pytest tests/install

test-unit: install
	$(BIN)/python -m pytest tests/unit

## The tests that talk to Redis and PostgreSQL (CI runs them on the machine's servers as well).
## The Spark audit's reads are left to `make test`: JDBC reads every PostgreSQL alike.
test-servers: install
	$(BIN)/python -m pytest $(XDIST) tests/integration --ignore=tests/integration/test_audit.py \
	  --ignore=tests/integration/test_audit_at_scale.py --ignore=tests/integration/test_audit_cluster.py

## Flake hunt: every tier `make test` runs, RUNS times in a row (default 10), every failure listed.
## LOAD=N keeps N busy-loop processes spinning meanwhile (a loaded machine: LOAD=$(WORKERS) or more);
## ARGS names what to run instead, e.g. ARGS='tests/e2e tests/topologies'.
LOAD ?= 0
ARGS ?=
flake: install
	WORKERS=$(WORKERS) LOAD=$(LOAD) scripts/flake.sh $(RUNS) $(ARGS)

lint: install
	$(BIN)/ruff check src tests bench migrations scripts conformance
	$(BIN)/ruff format --check src tests bench migrations scripts conformance
	$(BIN)/lint-imports

typecheck: install
	$(BIN)/mypy src

## Benchmarks: each prints its ratios against baselines measured in the same run.
bench: install
	$(BIN)/python bench/reclaim.py
	$(BIN)/python bench/reclaim_cluster.py
	$(BIN)/python bench/ingest.py
	$(BIN)/python bench/recover.py
	$(BIN)/python bench/audit.py
	$(BIN)/python bench/console.py
	$(BIN)/python bench/scale.py

## Chaos soak on servers of its own: agents SIGKILLed, conductors restarted and stopped, PostgreSQL
## stopped, Redis restarted empty; exit 1 on lost or doubled work or a live agent reclaimed.
## CHAOS='--fleet mixed --groups 2 --agent-users': Python and TypeScript agents in each of two
## groups, each agent its own Redis user (bench/chaos.py --help lists every option).
CHAOS ?=
chaos: install
	$(BIN)/python bench/chaos.py $(CHAOS)

chaos-quick: install
	$(BIN)/python bench/chaos.py --quick $(CHAOS)

## Helm chart and Dockerfile checks (tests/chart): real helm, kubernetes-validate, promtool, hadolint, checkov.
chart: install
	$(BIN)/python -m pytest tests/chart

## The TypeScript agent (clients/typescript): npm ci, strict build, unit tests, and the npm tarball
## a user installs, kept in $(RIG_ARTIFACTS_DIR)/npm.
RIG_ARTIFACTS_DIR ?= .artifacts
ts:
	cd clients/typescript && npm ci --no-audit --no-fund && npm run build && npm test
	mkdir -p "$(RIG_ARTIFACTS_DIR)/npm"
	cd clients/typescript && npm pack --pack-destination "$(abspath $(RIG_ARTIFACTS_DIR))/npm"

## The agent conformance suite (conformance/README.md): AGENT=python, typescript or a command line,
## through every scenario of the protocol on real servers (embedded unless RIG_TEST_* are set).
conformance: install
	$(BIN)/python -m pytest $(XDIST) conformance/scenarios --agent="$(AGENT)"

## Its negative tests: each scenario must fail against an agent that breaks its rule.
conformance-broken: install
	$(BIN)/python -m pytest $(XDIST) conformance/negative

## The container image without a Docker daemon (buildah; see scripts/build-image.sh).
image:
	scripts/build-image.sh

## The image built and run hardened against the real servers, with agents on the host.
## RIG_TEST_IMAGE=localhost/rig-conductor:V tests the image `make release` built instead of building
## one; RIG_RELEASE_DIR=dist adds the release's OCI archives of both images.
test-image: install
	$(BIN)/python -m pytest tests/image

## A rolling upgrade from the previous release (RIG_UPGRADE_FROM, default 0.1.0's commit), installed
## from this repository's history into .cache/upgrade/, to this tree: real serve and agent processes.
test-upgrade: install
	$(BIN)/python -m pytest tests/upgrade

## Everything a release ships, into dist/: wheel and sdist, both images as OCI archives, the
## chart, the npm tarball (once clients/typescript exists), SHA256SUMS (scripts/release.sh).
release: install
	PYTHON=$(BIN)/python scripts/release.sh

## dist/ as made by `make release`: the checksums hold and every artefact carries the version.
check-release: install
	$(BIN)/python -m pytest tests/release

## constraints.txt: every version a fresh `.[dev]` install resolves to today (CI, image, release).
lock:
	rm -rf .cache/lock && $(PYTHON) -m venv .cache/lock
	.cache/lock/bin/python -m pip install --quiet --upgrade pip
	.cache/lock/bin/python -m pip install --quiet '.[dev]'
	( echo "# Generated by 'make lock' from a fresh install of .[dev]; do not edit by hand."; \
	  .cache/lock/bin/python -m pip freeze --exclude-editable | grep -iv '^rig-conductor' ) > constraints.txt

clean:
	rm -rf $(VENV) .cache .mypy_cache .ruff_cache .pytest_cache .hypothesis build dist src/*.egg-info

## The documentation site (docs/ -> site/), strictly: a broken link or a missing page fails.
## docs/img takes the browser tests' screenshots of the last run, when there are any.
docs: install
	$(BIN)/python scripts/docs_screenshots.py
	$(BIN)/python scripts/gen_reference.py --check
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

## Preview the site at http://127.0.0.1:8000 while editing docs/.
docs-serve: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

## Regenerate docs/reference/ from the code (settings, CLI, HTTP API, metrics, log lines).
docs-ref: install
	$(BIN)/python scripts/gen_reference.py
