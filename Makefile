# colltutor: `make book` builds the course website, `make test` runs every test.
# Both set up a virtual environment in .venv first (Python 3.10+, 3.11 preferred).

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup system simgrid book notebooks test test-nccl-rules torch-suite lint clean

setup: $(VENV)/.installed

$(VENV)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -r requirements.txt
	$(BIN)/pip install -q --no-deps -e .
	touch $@

# Debian packages for the browser test (chromium), the Chinese edition's font
# (fonts-noto-cjk), the two-host test (iproute2) and the vendored JavaScript of the
# website (npm);
# installed only when running as root and only those missing (a machine whose Node.js
# already brings npm cannot take Debian's npm), otherwise those tests skip and say why.
system:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  missing=""; \
	  command -v chromium >/dev/null || missing="$$missing chromium"; \
	  command -v ip >/dev/null || missing="$$missing iproute2"; \
	  command -v npm >/dev/null || missing="$$missing npm"; \
	  [ -e /usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc ] \
	    || missing="$$missing fonts-noto-cjk"; \
	  if [ -n "$$missing" ]; then \
	    echo "apt-get install$$missing"; \
	    apt-get update -qq && apt-get install -y -qq \
	      $$missing >/dev/null; \
	  fi; \
	fi

# SimGrid for colltutor.simulate: Debian's and Ubuntu's python3-simgrid (installed as
# root when missing) brings one extension module, built for the system's Python; it
# is linked into .venv, alone, when the venv's Python is that version (Debian 12:
# 3.11).  Elsewhere `.venv/bin/pip install simgrid` builds it from source (README,
# "Simulated clusters"); without it, tests/test_simulate.py skips and says why.
# libsimgrid-dev (SimGrid's C++ headers, installed as root when missing) lets
# simulate(..., replay=True) compile its C++ replayer (colltutor/transports/replay.cpp).
DIST = /usr/lib/python3/dist-packages
PYVAR = $$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_config_var("$(1)"))')
SIMGRID_SO = $(DIST)/simgrid$(call PYVAR,EXT_SUFFIX)

simgrid: setup
	@if [ "$$(id -u)" = 0 ] && ! ls $(DIST)/simgrid.*.so >/dev/null 2>&1 \
	    && command -v apt-get >/dev/null; then \
	  echo "apt-get install python3-simgrid"; \
	  apt-get update -qq && apt-get install -y -qq python3-simgrid >/dev/null \
	    || echo "(no python3-simgrid here)"; \
	fi
	@if [ "$$(id -u)" = 0 ] && [ ! -e /usr/include/simgrid/s4u.hpp ] \
	    && command -v apt-get >/dev/null; then \
	  echo "apt-get install libsimgrid-dev"; \
	  apt-get update -qq && apt-get install -y -qq libsimgrid-dev >/dev/null \
	    || echo "(no libsimgrid-dev here)"; \
	fi
	@site=$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))'); \
	if [ -e "$(SIMGRID_SO)" ] && [ ! -e "$$site/$$(basename $(SIMGRID_SO))" ]; then \
	  ln -s "$(SIMGRID_SO)" "$$site/"; \
	fi
	@$(BIN)/python -c 'from colltutor.transports import simgrid; simgrid.load()' \
	  2>/dev/null && echo "SimGrid: ready" \
	  || echo "SimGrid: not installed, so colltutor.simulate is off (see README)"
	@$(BIN)/python -c 'from colltutor.transports import simgrid_replay as r; \
	  print("C++ replayer:", r.program())' 2>/dev/null \
	  || echo "C++ replayer: not built (no g++ or libsimgrid-dev), replays run on Python"

# Both editions: English in _build/html, Simplified Chinese in _build/html/zh_CN
# (tools/i18n.py, from the catalogues in locales/).
book: setup system simgrid
	$(BIN)/python tools/vendor_assets.py
	$(BIN)/jupyter-book build . -W -n --keep-going
	$(BIN)/python tools/i18n.py build

notebooks: setup
	$(BIN)/python tools/execute_notebooks.py

lint: setup
	$(BIN)/ruff check .

NBVAL := --nbval notebooks/ --nbval-current-env \
	  --nbval-sanitize-with notebooks/sanitize.cfg --nbval-cell-timeout=120

test: setup system simgrid lint book
	$(BIN)/python tools/i18n.py check
	COLLTUTOR_TORCH_SUITE=full $(BIN)/pytest -q tests/
	$(BIN)/pytest -q $(NBVAL) -p no:cacheprovider
	$(MAKE) --no-print-directory test-nccl-rules

# PyTorch's own DistributedTest collective tests, all of them, on native gloo and on
# the colltutor backend (`make test` runs them so; `pytest tests/` a fast subset).
torch-suite: setup
	COLLTUTOR_TORCH_SUITE=full $(BIN)/pytest -q -p no:cacheprovider tests/test_torch_suite.py

# The oracle matrix, the runtime and every notebook again under NCCL's rules on the
# CPU (colltutor/transports/nccl_rules.py): what a multi-GPU run would do.  Not
# rerun: the notebooks the rules cannot change, which start no NCCL ranks (11 and 12
# run only simulations; 13_ddp and 13_zero3 run on gloo on purpose, as they say).
# 08_barrier's straggler cell prints where each rank waits when the timeout hits;
# under the rules that depends on when gloo completes a send nobody receives.
SAME_UNDER_NCCL := 08_barrier 11_what_nccl_runs 12_at_a_thousand_gpus 13_ddp 13_zero3

test-nccl-rules: setup
	COLLTUTOR_EMULATE=nccl $(BIN)/pytest -q -p no:cacheprovider \
	  tests/test_collectives.py tests/test_runtime.py
	COLLTUTOR_EMULATE=nccl $(BIN)/pytest -q $(NBVAL) -p no:cacheprovider \
	  $(foreach nb,$(SAME_UNDER_NCCL),--ignore=notebooks/$(nb).ipynb)

clean:
	rm -rf _build $(VENV)
