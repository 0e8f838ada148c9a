# bftfs: the front door. `make demo` and `make test` are the two commands a newcomer needs; `make help` lists
# the rest. Everything here delegates: CMake/Ninja build the code, scripts/ hold the longer procedures.
#
# Variables (override on the command line, e.g. `make test SANITIZE=1 SEEDS=50`):
#   BUILD      build directory (default build; build-asan when SANITIZE=1 and BUILD is not given)
#   SANITIZE   1 = AddressSanitizer + UBSan build (-DBFTFS_SANITIZE=ON)
#   SEEDS      seeds for the whole-cluster simulation (make sim, make test)
#   SIM_ARGS   extra arguments for bftfs-sim (e.g. SIM_ARGS='--seed 1234' to replay one failure)
#   QUICK      1 = short benchmark runs (passed to the benchmark scripts as QUICK in the environment)
#   FUZZ_RUNS  passed to scripts/fuzz.sh in the environment
#   JOBS       ninja -j value (default: ninja's own choice)
#   PYTEST_ARGS extra arguments for pytest (make test)
#   BENCH_SYSTEMS, ANDREW_N, BENCH_REPEATS  make bench-fs: systems (native,local,norep,pbft), Andrew copies, repeats

BUILD ?= build
SANITIZE ?= 0
SEEDS ?= 300
# make sim also runs the overload scenario (sim/README.md) on this many seeds, and file-service seeds with an epoch
# client (speculation epochs, checker properties 11-15) on this many.
OVERLOAD_SEEDS ?= 50
EPOCH_SEEDS ?= 100
SIM_ARGS ?=
QUICK ?= 0
FUZZ_RUNS ?=
JOBS ?=
PYTEST_ARGS ?=
PYTHON ?= python3
BUILD_TYPE ?= RelWithDebInfo

CMAKE_ARGS := -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE)
ifeq ($(SANITIZE),1)
  ifeq ($(origin BUILD),file)
    BUILD := build-asan
  endif
  CMAKE_ARGS += -DBFTFS_SANITIZE=ON
else
  CMAKE_ARGS += -DBFTFS_SANITIZE=OFF
endif
NINJA_ARGS := $(if $(JOBS),-j $(JOBS),)
# ccache when present (optional in make deps): worktrees and CI rebuilds reuse objects. CCACHE_BASEDIR makes
# hits independent of the checkout's absolute path.
ifneq ($(shell command -v ccache 2>/dev/null),)
  CMAKE_ARGS += -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache
  export CCACHE_BASEDIR := $(abspath $(CURDIR)/..)
  export CCACHE_NOHASHDIR := 1
endif

# The pieces the test target runs.
UNIT_TESTS := $(BUILD)/tests/unit_tests
SIM := $(BUILD)/sim/bftfs-sim
BFTFS := $(BUILD)/cli/bftfs
INTEGRATION_DIR := tests/integration

# `make test` builds once and then runs the stages with _BUILT=1 so they do not re-run the build.
BUILT_OR_BUILD := $(if $(filter 1,$(_BUILT)),,all)

# Steps depend on each other in order (deps, then configure, then build); parallelism lives inside ninja.
.NOTPARALLEL:
.DEFAULT_GOAL := all
.PHONY: all build configure deps test unit sim integration fuzz lint bench bench-counter bench-faults bench-counter-wan demo \
        demo-counter bench-fs bench-fs-faults bench-fs-recovery bench-large-write bench-stress bench-fsync-floor bench-spec-run posix-external \
        clean help

help:
	@echo "bftfs make targets:"
	@echo "  make demo          install deps, build, mount bftfs on 4 replicas and on NO-REP, Andrew on each, side by side"
	@echo "  make demo-counter  the replication engine alone: counter on PBFT, PBFT-CS and NO-REP, side by side"
	@echo "  make test          install deps, build, run unit tests, simulation (SEEDS=$(SEEDS)), integration tests"
	@echo "  make deps          install Debian/Python packages, CRIU 4.1.1, Lua 5.4's source and httpd 2.4's tarball for the benchmarks (idempotent)"
	@echo "  make               configure and build into $(BUILD)/ (SANITIZE=1 for build-asan/)"
	@echo "  make unit | sim | integration   one test stage (sim: SEEDS=N, SIM_ARGS=...)"
	@echo "  make fuzz          libFuzzer targets (FUZZ_RUNS=N)"
	@echo "  make lint          layers and purity, sizes, pyflakes, shell syntax, -Werror build"
	@echo "  make bench         bench-counter, bench-faults, bench-counter-wan, bench-fs, bench-fs-faults, bench-large-write, bench-stress (QUICK=1 for a short run)"
	@echo "  make bench-counter-wan  PBFT-CS vs PBFT vs NO-REP across emulated WAN topologies"
	@echo "  make bench-fs      grep/write/create100 + Andrew on native, FUSE local, NO-REP, PBFT (QUICK=1, BENCH_SYSTEMS=...)"
	@echo "  make bench-fs-faults  Andrew on PBFT with a backup, then the primary, killed; tree vs a fault-free run"
	@echo "  make bench-fs-recovery  fs disk store: wiped replica rejoin, corrupt block repair, crash of all"
	@echo "  make bench-large-write  one large dd through the mount: time, memory, view changes (64 MiB-1 GiB)"
	@echo "  make bench-stress  overload: O_APPEND records, mmap writes, create/rename storm; stat waits, view changes, drain"
	@echo "  make bench-spec-run  bftfs run: Lua build at primary-local 15 ms (plain, speculating, 1% lies), LAN build, httpd untar"
	@echo "  make bench-fsync-floor  the disk's durable-write latency, 1 and 4 writers: the floor under PBFT's latency"
	@echo "  make posix-external  pjdfstest and fsx (cargo install) against a local bftfs mount"
	@echo "  make clean         remove build directories"

deps:
	@bash scripts/deps.sh

# Configure when the build directory is new or was configured with other arguments; afterwards ninja re-runs
# CMake by itself whenever a CMakeLists.txt changes.
configure:
	@if [ ! -f "$(BUILD)/build.ninja" ] || [ "$$(cat "$(BUILD)/.bftfs-cmake-args" 2>/dev/null)" != "$(CMAKE_ARGS)" ]; then \
	  echo "cmake -S . -B $(BUILD) $(CMAKE_ARGS)"; \
	  cmake -S . -B "$(BUILD)" $(CMAKE_ARGS) && echo "$(CMAKE_ARGS)" > "$(BUILD)/.bftfs-cmake-args"; \
	fi

all build: configure
	ninja -C "$(BUILD)" $(NINJA_ARGS)

# Each stage runs even if an earlier one failed, so one run reports everything; the target fails if any did.
# On success the last lines printed are the test runners' own summaries.
test: deps all
	@failed=""; \
	$(MAKE) --no-print-directory unit _BUILT=1 || failed="$$failed unit_tests"; \
	$(MAKE) --no-print-directory sim _BUILT=1 || failed="$$failed bftfs-sim"; \
	$(MAKE) --no-print-directory integration _BUILT=1 || failed="$$failed integration"; \
	if [ -n "$$failed" ]; then echo "make test: FAILED:$$failed" >&2; exit 1; fi

unit: $(BUILT_OR_BUILD)
	@test -x "$(UNIT_TESTS)" || { echo "$(UNIT_TESTS) was not built" >&2; exit 1; }
	@echo "== unit tests: $(UNIT_TESTS)"
	@"$(UNIT_TESTS)"

sim: $(BUILT_OR_BUILD)
	@test -x "$(SIM)" || { echo "$(SIM) was not built" >&2; exit 1; }
	@echo "== simulation: $(SIM) --seeds $(SEEDS) $(SIM_ARGS)"
	@"$(SIM)" --seeds $(SEEDS) $(SIM_ARGS)
	@echo "== simulation: $(SIM) --scenario overload --seeds $(OVERLOAD_SEEDS)"
	@"$(SIM)" --scenario overload --seeds $(OVERLOAD_SEEDS)
	@echo "== simulation: $(SIM) --service fs --epochs 1 --seeds $(EPOCH_SEEDS)"
	@"$(SIM)" --service fs --epochs 1 --seeds $(EPOCH_SEEDS)

# Integration tests need real binaries: BFTFS_REQUIRE_BINARIES=1 turns "binary not built" from a skip into a
# failure here (a pytest run on its own still skips with the reason).
integration: $(BUILT_OR_BUILD)
	@if ! find "$(INTEGRATION_DIR)" -name 'test_*.py' -o -name '*_test.py' 2>/dev/null | grep -q .; then \
	  echo "== integration tests: none yet in $(INTEGRATION_DIR)/ (nothing run)"; \
	else \
	  echo "== integration tests: $(INTEGRATION_DIR)"; \
	  BFTFS_BUILD="$(abspath $(BUILD))" BFTFS_REQUIRE_BINARIES=1 $(PYTHON) -m pytest -q $(PYTEST_ARGS) "$(INTEGRATION_DIR)"; \
	fi

fuzz: deps
	@test -f scripts/fuzz.sh || { echo "scripts/fuzz.sh does not exist yet" >&2; exit 1; }
	$(if $(FUZZ_RUNS),FUZZ_RUNS="$(FUZZ_RUNS)" ,)bash scripts/fuzz.sh

lint:
	@JOBS="$(JOBS)" PYTHON="$(PYTHON)" bash scripts/lint.sh

bench: bench-counter bench-faults bench-counter-wan bench-fs bench-fs-faults bench-large-write bench-stress

bench-counter: deps all
	BFTFS_BUILD="$(abspath $(BUILD))" QUICK="$(QUICK)" $(PYTHON) benchmarks/bench_counter.py

bench-faults: deps all
	BFTFS_BUILD="$(abspath $(BUILD))" QUICK="$(QUICK)" $(PYTHON) benchmarks/bench_faults.py

bench-counter-wan: deps all
	BFTFS_BUILD="$(abspath $(BUILD))" QUICK="$(QUICK)" $(PYTHON) benchmarks/bench_counter_wan.py

# The file-system benchmarks (benchmarks/bench_fs.py); BENCH_SYSTEMS, ANDREW_N and BENCH_REPEATS pass through.
bench-fs: deps all
	BFTFS_BUILD="$(abspath $(BUILD))" QUICK="$(QUICK)" $(PYTHON) benchmarks/bench_fs.py

bench-fs-faults: deps all
	BFTFS_BUILD="$(abspath $(BUILD))" QUICK="$(QUICK)" $(PYTHON) benchmarks/bench_fs.py --faults

bench-fs-recovery: deps all
	BFTFS_BUILD="$(abspath $(BUILD))" QUICK="$(QUICK)" $(PYTHON) benchmarks/bench_fs_recovery.py

bench-large-write: deps all
	BFTFS_BUILD="$(abspath $(BUILD))" QUICK="$(QUICK)" $(PYTHON) benchmarks/bench_large_write.py

# Overload through a relay mount (six O_APPEND writers of 4-byte records, many small mmap writes, a
# create/rename storm) against the same client on a local FUSE mount: bench-results/stress.json.
bench-stress: deps all
	BFTFS_BUILD="$(abspath $(BUILD))" QUICK="$(QUICK)" $(PYTHON) benchmarks/bench_stress.py

# `bftfs run` end to end (docs/SPECULATION.md §15): bench-results/spec-run.json. Needs root and CRIU.
bench-spec-run: deps all
	BFTFS_BUILD="$(abspath $(BUILD))" QUICK="$(QUICK)" $(PYTHON) benchmarks/bench_spec_run.py

# The disk's durable-write latency, alone and with four writers at once: the floor under PBFT's latency.
bench-fsync-floor:
	QUICK="$(QUICK)" $(PYTHON) benchmarks/bench_fsync_floor.py

# Independent POSIX tools (pjdfstest, fsx-rs; installed with cargo the first time) against a local bftfs mount.
posix-external: all
	@BFTFS_BUILD="$(abspath $(BUILD))" bash tests/tools/posix_external.sh

demo: deps all
	@BFTFS_BUILD="$(abspath $(BUILD))" bash scripts/demo.sh

demo-counter: deps all
	@BFTFS_BUILD="$(abspath $(BUILD))" bash scripts/demo-counter.sh

clean:
	rm -rf build build-asan build-lint build-fuzz "$(BUILD)"
