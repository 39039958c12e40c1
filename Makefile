# The two commands: `make demo` and `make test`. Both install what is missing first.
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
export PATH := $(BIN):$(PATH)

.PHONY: bootstrap demo test lint typecheck unit spark integration crash slow clean

bootstrap:
	@bash scripts/bootstrap.sh

demo: bootstrap
	@$(BIN)/cdc demo

# two workers, a test file each at a time (pytest-xdist): TEST_WORKERS=0 runs in one process;
# files are handed out in the order tests/conftest.py sorts them (longest first)
TEST_WORKERS ?= 2

test: bootstrap lint typecheck
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -v

lint:
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck:
	$(BIN)/mypy

unit spark integration: bootstrap
	$(BIN)/pytest tests/$@

# the crash-anywhere suite alone (`make test` runs it too): CDC_CRASH_SEED=N replays a schedule
crash: bootstrap
	$(BIN)/pytest -m crash -s tests/integration/test_crash.py

# long cases kept out of `make test` for the same budget
slow: bootstrap
	$(BIN)/pytest -m slow tests/integration

clean:
	rm -rf lake .pytest_cache .mypy_cache .ruff_cache
