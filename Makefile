# colltutor: `make book` builds the course website, `make test` runs every test.
# Both set up a virtual environment in .venv first (Python 3.10+, 3.11 preferred).

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup system book notebooks test lint clean

setup: $(VENV)/.installed

$(VENV)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -r requirements.txt
	$(BIN)/pip install -q --no-deps -e .
	touch $@

# Debian packages for the browser test (chromium), the two-host test (iproute2) and
# the vendored JavaScript of the website (npm);
# installed only when running as root and only those missing (a machine whose Node.js
# already brings npm cannot take Debian's npm), otherwise those tests skip and say why.
system:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  missing=""; \
	  command -v chromium >/dev/null || missing="$$missing chromium"; \
	  command -v ip >/dev/null || missing="$$missing iproute2"; \
	  command -v npm >/dev/null || missing="$$missing npm"; \
	  if [ -n "$$missing" ]; then \
	    echo "apt-get install$$missing"; \
	    apt-get update -qq && apt-get install -y -qq \
	      $$missing >/dev/null; \
	  fi; \
	fi

book: setup system
	$(BIN)/python tools/vendor_assets.py
	$(BIN)/jupyter-book build . -W -n --keep-going

notebooks: setup
	$(BIN)/python tools/execute_notebooks.py

lint: setup
	$(BIN)/ruff check .

test: setup system lint book
	$(BIN)/pytest -q tests/
	$(BIN)/pytest -q --nbval notebooks/ --nbval-current-env \
	  --nbval-sanitize-with notebooks/sanitize.cfg \
	  --nbval-cell-timeout=120 -p no:cacheprovider

clean:
	rm -rf _build $(VENV)
