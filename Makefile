# The two commands of the README:
#   make demo   runs the main job end to end on the embedded defaults
#   make test   installs what the tests need and runs them
SHELL := /bin/bash
# Python 3.11 runs both training runtimes; 3.12 and 3.13 the autograd runtime only (onnxruntime-training
# has no wheel for them: constraints.txt puts plain onnxruntime in its place). The first one found wins.
PY ?= $(or $(firstword $(foreach v,3.11 3.13 3.12,$(shell command -v python$(v) 2>/dev/null))),python3.11)
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/pip install -q --disable-pip-version-check -c constraints.txt
# pip on these machines warns about absent local index folders; keep the output readable
QUIET := 2>&1 | { grep -v 'is ignored: it is neither a file nor a directory' || true; }
STAMP := $(VENV)/.installed
export ODL_HOME ?= $(CURDIR)/.odl

.PHONY: demo nightly teacher teacher-detection segmentation keypoints fleet down test install system-deps lint docs docs-serve clean

$(STAMP): pyproject.toml constraints.txt deploy/system-packages.txt
	@command -v $(PY) >/dev/null || { echo "need python3.11 (both training runtimes) or python3.13/3.12 (autograd only)"; exit 1; }
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@echo "installing Python packages from constraints.txt into $(VENV) (first time: a few minutes)"
	@set -o pipefail; $(PIP) -e '.[test,docs]' $(QUIET)
	@! { $(BIN)/pip show -q onnxruntime && $(BIN)/pip show -q onnxruntime-training; } 2>/dev/null || { echo "plain onnxruntime is installed beside onnxruntime-training: remove it"; exit 1; }
	@touch $(STAMP)

install: $(STAMP) system-deps

system-deps:
	@bash deploy/install-system-packages.sh

test: install
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

# virtual board + Prefect server (SQLite) + pool + deployment odl/full + worker, then
# `prefect deployment run odl/full --watch`; everything stays up for the UI until `make down`
demo: install
	@BIN=$(BIN) bash deploy/demo.sh up

# the same stack, then three nights of recipes/digits_nightly.toml, a shard appended on the board
# before each (warm start, new + replayed data, the promotion gate, rollout to the board)
nightly: install
	@BIN=$(BIN) bash deploy/demo.sh nightly

# the same stack, then two nights of recipes/digits_teacher.toml: unlabeled shards appended on the
# board, a teacher model labels them there before each run, the student trains on its labels
teacher: install
	@BIN=$(BIN) bash deploy/demo.sh teacher

# the same for a detector: recipes/ssdlite_teacher.toml (the teacher's boxes matched to the student's priors)
teacher-detection: install
	@BIN=$(BIN) bash deploy/demo.sh teacher-detection

# the same stack, then recipes/segmentation.toml: a U-Net pretrained on one domain of generated shapes,
# fine-tuned on the board on a shifted one, judged on mIoU (its data take ~30 s to make the first time)
segmentation: install
	@BIN=$(BIN) bash deploy/demo.sh segmentation

# the same stack, then recipes/keypoints.toml: a heatmap U-Net pretrained on stick figures of one domain,
# fine-tuned on the board on a shifted one, judged on OKS AP (its data take ~20 s to make the first time)
keypoints: install
	@BIN=$(BIN) bash deploy/demo.sh keypoints

# the same stack, four virtual boards (group "lab") with non-IID shares of the digits, and
# `prefect deployment run odl/fleet`: three FedAvg rounds, the aggregate judged and rolled out
fleet: install
	@BIN=$(BIN) bash deploy/demo.sh fleet

# stop worker, server and virtual board (by their recorded pids); data stays under $(ODL_HOME)
down:
	@BIN=$(BIN) bash deploy/demo.sh down

# the manual (docs/, mkdocs.yml) into site/, warnings, broken links and anchors failing the build;
# docs/reference/ is generated from the code: $(BIN)/python -m docs.gen rewrites it (a test compares)
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -q

# the manual on http://127.0.0.1:8000, rebuilt as its files change
docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --strict

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache site
