/* The C API from C (C11, no C++): a runtime from explicit settings, a stream, a tensor written
 * on the CPU and read back through the GPU tier, the stats, one error, and teardown.
 * Exits 0 and prints "c_api_c_test: ok" when everything held. */
#include <stdio.h>
#include <string.h>

#include "strata/strata.h"

#define CHECK_OK(call)                                                  \
  do {                                                                  \
    strata_status_t status_ = (call);                                   \
    if (status_ != STRATA_OK) {                                         \
      fprintf(stderr, "%s:%d: %s: %s: %s\n", __FILE__, __LINE__, #call, \
              strata_status_name(status_), strata_last_error());        \
      return 1;                                                         \
    }                                                                   \
  } while (0)

int main(void) {
  const strata_setting_t settings[] = {{"STRATA_BACKEND", "host"},
                                       {"STRATA_GPU_BYTES", "1MiB"},
                                       {"STRATA_CPU_BYTES", "4MiB"},
                                       {"STRATA_NVME_PATHS", NULL}};
  strata_runtime_t* runtime = NULL;
  CHECK_OK(strata_runtime_create(settings, sizeof settings / sizeof settings[0], &runtime));
  strata_stream_t* stream = NULL;
  CHECK_OK(strata_stream_create(runtime, &stream));

  const size_t kBytes = 64 * 1024;
  strata_tensor_t tensor = {0, 0, 0};
  CHECK_OK(strata_tensor_create(runtime, "c.weight", kBytes, STRATA_TIER_CPU, &tensor));
  void* cpu = NULL;
  CHECK_OK(strata_tensor_acquire(tensor, STRATA_TIER_CPU, stream, STRATA_ACCESS_WRITE, &cpu));
  memset(cpu, 0x5a, kBytes);
  CHECK_OK(strata_tensor_release(tensor, stream));

  void* gpu = NULL;
  CHECK_OK(strata_tensor_acquire(tensor, STRATA_TIER_GPU, stream, STRATA_ACCESS_READ, &gpu));
  CHECK_OK(strata_stream_synchronize(stream)); /* the host backend's GPU tier is host memory */
  const unsigned char* bytes = (const unsigned char*)gpu;
  for (size_t i = 0; i < kBytes; ++i) {
    if (bytes[i] != 0x5a) {
      fprintf(stderr, "byte %zu is 0x%02x, not 0x5a\n", i, bytes[i]);
      return 1;
    }
  }
  CHECK_OK(strata_tensor_release(tensor, stream));

  /* A second release is an error with a message, not a crash. */
  if (strata_tensor_release(tensor, stream) != STRATA_FAILED_PRECONDITION ||
      strstr(strata_last_error(), "release without acquire") == NULL) {
    fprintf(stderr, "double release: %s\n", strata_last_error());
    return 1;
  }

  strata_stats_t stats;
  CHECK_OK(strata_runtime_stats(runtime, &stats));
  if (stats.tensors != 1 || stats.acquires != 2 ||
      stats.moves[STRATA_TIER_CPU][STRATA_TIER_GPU].bytes != kBytes) {
    fprintf(stderr, "stats: %llu tensors, %llu acquires, %llu bytes cpu->gpu\n",
            (unsigned long long)stats.tensors, (unsigned long long)stats.acquires,
            (unsigned long long)stats.moves[STRATA_TIER_CPU][STRATA_TIER_GPU].bytes);
    return 1;
  }

  CHECK_OK(strata_tensor_destroy(tensor));
  CHECK_OK(strata_stream_destroy(stream));
  CHECK_OK(strata_runtime_destroy(runtime));
  if (strata_runtime_destroy(runtime) != STRATA_NOT_FOUND) {
    fprintf(stderr, "a second destroy was not NOT_FOUND\n");
    return 1;
  }
  printf("c_api_c_test: ok\n");
  return 0;
}
