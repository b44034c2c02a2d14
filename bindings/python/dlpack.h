// The DLPack structures (https://github.com/dmlc/dlpack, version 0.8, Apache-2.0), written out
// here because Debian has no dlpack package. Only what a producer of "dltensor" capsules needs:
// DLDevice, DLDataType, DLTensor and DLManagedTensor, with the ABI of dlpack.h v0.8.
#pragma once

#include <cstdint>

extern "C" {

#define DLPACK_VERSION 80
#define DLPACK_ABI_VERSION 1

typedef enum {  // NOLINT(modernize-use-using): the C ABI as published
  kDLCPU = 1,
  kDLCUDA = 2,
  kDLCUDAHost = 3,
  kDLOpenCL = 4,
  kDLVulkan = 7,
  kDLMetal = 8,
  kDLVPI = 9,
  kDLROCM = 10,
  kDLROCMHost = 11,
  kDLExtDev = 12,
  kDLCUDAManaged = 13,
  kDLOneAPI = 14,
  kDLWebGPU = 15,
  kDLHexagon = 16,
} DLDeviceType;

typedef struct {
  DLDeviceType device_type;
  int32_t device_id;
} DLDevice;

typedef enum {
  kDLInt = 0U,
  kDLUInt = 1U,
  kDLFloat = 2U,
  kDLOpaqueHandle = 3U,
  kDLBfloat = 4U,
  kDLComplex = 5U,
  kDLBool = 6U,
} DLDataTypeCode;

typedef struct {
  uint8_t code;    // DLDataTypeCode
  uint8_t bits;    // bits per lane
  uint16_t lanes;  // 1 for scalars
} DLDataType;

typedef struct {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // null: compact row-major
  uint64_t byte_offset;
} DLTensor;

typedef struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(struct DLManagedTensor* self);
} DLManagedTensor;

}  // extern "C"
