// A library that says it is NCCL 2.7.8 (too old for strata), for nccl_library_test.
extern "C" int ncclGetVersion(int* version) {
  *version = 2708;
  return 0;
}
