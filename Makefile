# The quick start: `make test` and `make bench` each do all set-up (packages, configure, build).
# Everything else is plain CMake; this file only strings the steps together.

BUILD      ?= build
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
# `make test SANITIZERS=off` skips the address/undefined and thread sanitizer runs.
SANITIZERS ?= on
# The plain build is Release (what most users build); the ASan build is Debug and the TSan build
# RelWithDebInfo, so `make test` compiles all three. Warnings are errors in all of them
# (STRATA_WERROR; a user's own `cmake` build leaves it off).
BUILD_TYPE ?= Release
CMAKE_ARGS ?=
WERROR     ?= -DSTRATA_WERROR=ON
GENERATOR  := $(shell command -v ninja >/dev/null 2>&1 && echo "-G Ninja")

.PHONY: all deps build test test-asan test-tsan bench clean

all: build

deps:
	@tools/install-deps.sh

# Configures when the build folder has not been configured yet, or again when this Makefile is
# newer than its cache (so a changed BUILD_TYPE or WERROR here reaches an existing folder). A
# BUILD_TYPE given on the command line to an existing folder needs `make clean` first.
$(BUILD)/CMakeCache.txt: Makefile | deps
	cmake -S . -B $(BUILD) $(GENERATOR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(WERROR) $(CMAKE_ARGS)

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

test: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)
ifeq ($(SANITIZERS),on)
	$(MAKE) --no-print-directory test-asan test-tsan
endif

test-asan: deps
	$(MAKE) --no-print-directory build BUILD=$(BUILD)-asan BUILD_TYPE=Debug \
	  CMAKE_ARGS="-DSTRATA_SANITIZE=address,undefined $(CMAKE_ARGS)"
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --test-dir $(BUILD)-asan --output-on-failure -j $(JOBS)

test-tsan: deps
	$(MAKE) --no-print-directory build BUILD=$(BUILD)-tsan BUILD_TYPE=RelWithDebInfo \
	  CMAKE_ARGS="-DSTRATA_SANITIZE=thread $(CMAKE_ARGS)"
	TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
	  ctest --test-dir $(BUILD)-tsan --output-on-failure -j $(JOBS)

bench: build
	$(BUILD)/tools/offload-bench

clean:
	rm -rf $(BUILD) $(BUILD)-asan $(BUILD)-tsan build-pip
