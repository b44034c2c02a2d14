/* A C program outside strata's tree, built with `cc -std=c11 main.c $(pkg-config --cflags --libs
 * strata)` against the installed prefix: a runtime, a tensor written and read back. */
#include <stdio.h>
#include <strata/strata.h>
#include <string.h>

static int failed(const char* what, strata_status_t status) {
  fprintf(stderr, "%s: %s: %s\n", what, strata_status_name(status), strata_last_error());
  return 1;
}

int main(void) {
  const strata_setting_t settings[] = {{"STRATA_BACKEND", "host"},
                                       {"STRATA_GPU_BYTES", "1MiB"},
                                       {"STRATA_CPU_BYTES", "2MiB"},
                                       {"STRATA_NVME_PATHS", NULL}};
  strata_runtime_t* runtime = NULL;
  strata_status_t status = strata_runtime_create(settings, 4, &runtime);
  if (status != STRATA_OK) return failed("strata_runtime_create", status);
  strata_stream_t* stream = NULL;
  strata_tensor_t tensor;
  void* data = NULL;
  if ((status = strata_stream_create(runtime, &stream)) != STRATA_OK ||
      (status = strata_tensor_create(runtime, "x", 4096, STRATA_TIER_CPU, &tensor)) != STRATA_OK ||
      (status = strata_tensor_acquire(tensor, STRATA_TIER_CPU, stream, STRATA_ACCESS_WRITE,
                                      &data)) != STRATA_OK) {
    return failed("setting up", status);
  }
  memset(data, 7, 4096);
  if ((status = strata_tensor_release(tensor, stream)) != STRATA_OK ||
      (status = strata_tensor_acquire(tensor, STRATA_TIER_GPU, stream, STRATA_ACCESS_READ,
                                      &data)) != STRATA_OK ||
      (status = strata_stream_synchronize(stream)) != STRATA_OK) {
    return failed("moving", status);
  }
  if (((const unsigned char*)data)[4095] != 7) {
    fprintf(stderr, "the bytes did not arrive\n");
    return 1;
  }
  if ((status = strata_tensor_release(tensor, stream)) != STRATA_OK ||
      (status = strata_runtime_destroy(runtime)) != STRATA_OK) {
    return failed("tearing down", status);
  }
  printf("c consumer: strata C API works through pkg-config\n");
  return 0;
}
