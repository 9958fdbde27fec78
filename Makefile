# The two commands a new user needs: `make up` and `make test`. Both install first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# A GPU host installs the CUDA build of the same torch release instead, e.g.
#   make install TORCH_SPEC="torch==2.13.0" TORCH_INDEX="<PyTorch's CUDA wheel index for your CUDA>"
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=

.PHONY: install up up-replay test lint typecheck unit bench gpu-check deepspeed-check clean

install: $(STAMP)

$(STAMP): pyproject.toml requirements.lock requirements-dev.lock
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip "setuptools>=77"
	$(BIN)/python -m pip install --quiet $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -r requirements.lock -r requirements-dev.lock
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

# A local cluster that runs your jobs: the embedded broker, every service and two
# host agents of four emulated GPUs each (`--hosts`, `--gpus`; real GPUs through
# pynvml where the machine has them). Publish a job to rltune.jobs.submit from
# another terminal (`rltune submit ... --wait finished`, or
# examples/submit_and_follow.py with a stock Kafka client) and it runs here.
UP_ARGS ?=

up: install
	$(BIN)/rltune up $(UP_ARGS)

# The whole system replaying a trace on a simulated cluster: the shipped learned
# policy ranks, the offload-aware MILP places, 30% of the jobs train with 10Cache
# (their hit rate and migration time show in the live view), on a 360-GPU P100/V100
# cluster that the 2,000-job sample loads enough for jobs to queue. Users' jobs are
# refused during a replay, with the reason.
REPLAY_ARGS ?= --trace examples/philly-2000.jsonl --cluster clusters/philly-10k.yaml --policy rl --placer milp+offload --offload-fraction 0.3

up-replay: install
	$(BIN)/rltune up $(REPLAY_ARGS)

# the docs/ site too: a broken link, a missing page or one left out of mkdocs.yml's nav fails
# (not --quiet: with it, mkdocs 1.6 no longer counts warnings and --strict passes anything)
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

typecheck: install
	$(BIN)/mypy rltune/ shared/ services/ offload_agent/ bench/ tests/

# three workers on two cores: the broker tests spend most of their time waiting on
# round trips and timeouts, so a third worker fills the gaps (each worker starts its own
# broker); TEST_WORKERS=0 runs in one process. Work stealing: an idle worker takes
# tests queued on a busy one, so the long broker tests do not end the run on one worker
TEST_WORKERS ?= 3

unit: install
	$(BIN)/python -m pytest -q --durations=15 -n $(TEST_WORKERS) --dist worksteal

test: lint typecheck unit

bench: install
	$(BIN)/rltune bench bus

# On a GPU host (installed with the CUDA build): the offload engine's training
# tests against plain PyTorch on the GPU, bit for bit (they need no broker or
# traces: the project-wide conftest is left out), then the link it gets
gpu-check: install
	RLTUNE_TEST_DEVICE=cuda $(BIN)/python -m pytest -q --confcutdir=tests/offload_agent tests/offload_agent/test_offload_training.py tests/offload_agent/test_offload_precision.py
	$(BIN)/rltune bench offload_link

# DeepSpeed ZeRO-3 beside the engine: the optional `deepspeed` extra (not in `make
# install` or `make test`, whose tests of it skip without it: its first use JIT-compiles
# DeepSpeed's CPU AdamW and communication ops, about 3 minutes of two cores), built
# against the installed torch with no ops prebuilt, then its tests on DeepSpeed's CPU
# accelerator. NVMe offload also needs libaio's headers (Debian: libaio-dev).
deepspeed-check: install
	DS_BUILD_OPS=0 $(BIN)/python -m pip install --quiet --no-build-isolation -e ".[deepspeed]"
	$(BIN)/python -m pytest -q tests/bench/test_offload_deepspeed.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache site
