// A library that says it is NCCL, for nccl_library_test: 2.7.8 (too old for strata) by default;
// built again with STRATA_FAKE_NCCL_VERSION=22000 it says 2.20.0 and lacks every other function
// (the table's "lacks" error).
#ifndef STRATA_FAKE_NCCL_VERSION
#define STRATA_FAKE_NCCL_VERSION 2708
#endif

extern "C" int ncclGetVersion(int* version) {
  *version = STRATA_FAKE_NCCL_VERSION;
  return 0;
}
