# The two commands that matter on a fresh machine: `make demo` and `make test` (the whole suite, what
# CI runs); `make test-fast` is the inner loop (README: which to run when).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test test-fast lint screenshots install clean

$(BIN)/python:
	@echo "== creating the virtual environment $(VENV)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# Editable install so conf/ and the embedded models are found beside the package. The demo needs only
# the package; the test extras (Helm SDK, fuzzers, clients) come with `make test`.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	@echo "== installing appliance and what it needs (torch, transformers, rasterio, litserve, ...)"
	@echo "   into $(VENV): about 2-3 minutes (longer if pip must download torch), silent until pip is done"
	$(BIN)/pip install --quiet -e .
	touch $@

# The browser tests (tests/ui) drive Debian's chromium through Playwright (its own browser download
# cannot work offline), the STAC API tests a throwaway PostgreSQL with PostGIS (tests/stac_api.py): both
# installed here where we are root with apt-get; elsewhere those tests skip, saying why.
$(VENV)/.test-installed: $(VENV)/.installed
	@echo "== installing the test extras (pytest, HTTP clients, Helm SDK, fuzzers, Playwright): quiet until pip is done"
	$(BIN)/pip install --quiet -e '.[test]'
	@if [ ! -x /usr/bin/chromium ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "== installing Debian's chromium for the browser tests (apt-get; a few minutes)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	elif [ ! -x /usr/bin/chromium ]; then \
		echo "== /usr/bin/chromium is missing and apt-get cannot run here: the browser tests (tests/ui) will skip"; \
	fi
	@if ! ls /usr/share/postgresql/*/extension/postgis.control >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "== installing Debian's PostgreSQL and PostGIS for the STAC API tests (apt-get)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql postgresql-15-postgis-3 >/dev/null; \
	elif ! ls /usr/share/postgresql/*/extension/postgis.control >/dev/null 2>&1; then \
		echo "== PostgreSQL with PostGIS is missing and apt-get cannot run here: the STAC API tests (tests/geo) will skip"; \
	fi
	touch $@

# Our CPU kernels, compiled once into the installed package (docs/engine.md); the engine would otherwise
# build them on first use. Rebuilt when their sources change.
$(VENV)/.kernels: $(wildcard appliance/engine/csrc/*) $(VENV)/.installed
	@echo "== compiling the engine's CPU kernels (once; docs/engine.md)"
	$(BIN)/python -m appliance.engine.build_kernels
	touch $@

install: $(VENV)/.installed $(VENV)/.kernels

# The main job on the embedded default model: flood-map the bundled sample scene; then ask the
# embedded tiny LLaVA about the bundled sample image.
demo: install
	@echo "== demo 1/2: flood-map the bundled sample scene into demo-output/flood_sample.mask.tif"
	$(BIN)/appliance run pipeline=prithvi_flood input=appliance/assets/samples/flood_sample.tif \
		output=demo-output/flood_sample.mask.tif overwrite=true
	@echo "== demo 2/2: ask the embedded tiny LLaVA what colour the shape in orange_star.png is"
	$(BIN)/appliance run pipeline=llava_chat input=appliance/assets/samples/orange_star.png \
		prompt="What color is the shape?"

# The static gate, run before the tests: ruff over the tree, mypy over the package (both configured in
# pyproject.toml).
lint: $(VENV)/.test-installed
	$(BIN)/ruff check
	$(BIN)/mypy appliance

test: install $(VENV)/.test-installed lint
	$(BIN)/python -m pytest

# Everything but the slow tier (tests/conftest.py SLOW: CLI and server processes, TP ranks, end-to-end
# model runs); every package is still reached.
test-fast: install $(VENV)/.test-installed
	$(BIN)/python -m pytest -m "not slow"

# The pictures of the pages in README.md and docs/, taken anew by the browser tests that show them.
screenshots: install $(VENV)/.test-installed
	$(BIN)/python -m pytest tests/ui --docs-screenshots -q

clean:
	rm -rf $(VENV) *.egg-info demo-output
