# The quick start: `make test` and `make bench` each do all set-up (packages, configure, build).
# Everything else is plain CMake; this file only strings the steps together.

BUILD      ?= build
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
# `make test SANITIZERS=off` skips the address/undefined and thread sanitizer runs.
SANITIZERS ?= on
BUILD_TYPE ?= RelWithDebInfo
CMAKE_ARGS ?=
GENERATOR  := $(shell command -v ninja >/dev/null 2>&1 && echo "-G Ninja")

.PHONY: all deps build test test-asan test-tsan bench clean

all: build

deps:
	@tools/install-deps.sh

# Re-configures only when the build folder has not been configured yet.
$(BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD) $(GENERATOR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_ARGS)

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
	$(MAKE) --no-print-directory build BUILD=$(BUILD)-tsan \
	  CMAKE_ARGS="-DSTRATA_SANITIZE=thread $(CMAKE_ARGS)"
	TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
	  ctest --test-dir $(BUILD)-tsan --output-on-failure -j $(JOBS)

bench: build
	$(BUILD)/tools/offload-bench

clean:
	rm -rf $(BUILD) $(BUILD)-asan $(BUILD)-tsan
