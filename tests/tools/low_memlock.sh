#!/usr/bin/env bash
# Runs a command with RLIMIT_MEMLOCK at 64 KiB and without CAP_IPC_LOCK (where setpriv can drop
# it), so that a configuration with an NVMe tier has a warning on any machine: a CPU tier above the
# memlock limit with io_uring, or the psync fallback without it.
ulimit -l 64 || exit 1
drop="--inh-caps=-ipc_lock --bounding-set=-ipc_lock"
# shellcheck disable=SC2086
if command -v setpriv >/dev/null 2>&1 && setpriv $drop true 2>/dev/null; then
  exec setpriv $drop "$@"
fi
exec "$@"
