# One entry point for newcomers and CI. `make run` and `make test` install what they need, at the
# versions pinned in uv.lock.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
UV      := $(shell command -v uv 2>/dev/null || echo $(BIN)/uv)
STAMP   := $(VENV)/.installed

.PHONY: setup run test test-fast lint crds render images clean

# The exact versions in uv.lock (`uv lock` after changing a dependency; a stale lock fails here).
$(STAMP): pyproject.toml uv.lock
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@command -v uv >/dev/null 2>&1 || test -x $(BIN)/uv || $(BIN)/pip install -q uv
	UV_PROJECT_ENVIRONMENT=$(VENV) $(UV) sync --locked --inexact --extra dev --python $(BIN)/python
	@touch $(STAMP)

setup: $(STAMP)

run: setup
	$(BIN)/omni up

test: setup
	bash tests/run.sh

test-fast: setup
	$(BIN)/pytest -q tests/unit

lint: setup
	$(BIN)/ruff check operator runtime tests
	$(BIN)/ruff format --check operator runtime tests
	$(BIN)/mypy
	$(BIN)/lint-imports

crds: setup
	$(BIN)/omni crd -o crds/
	$(BIN)/omni crd -o helm/omni-operator/crds/

render: setup
	$(BIN)/omni render -f examples/tiny-cpu.yaml

# The runtime (CPU variant) and operator images with buildah, on a Debian base made with mmdebstrap
# (no image registry needed); cached, so a second run takes seconds. See images/build.sh.
images: setup
	bash images/build.sh

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
