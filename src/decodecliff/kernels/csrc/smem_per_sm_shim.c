// Preloaded (LD_PRELOAD) into a process that runs a library which sizes its kernels by the GPU's
// shared memory per SM, as FlashInfer's MLA kernel does (cudaDevAttrMaxSharedMemoryPerMultiprocessor
// picks its stages and KV tile). While dc_set_smem_per_sm(n) holds n > 0, that attribute reads at
// most n, so on an H200 the library takes the configuration it would take on an sm_120 GPU
// (n = 102400) and runs that configuration's unmodified kernel. Every other query passes through.
#define _GNU_SOURCE
#include <dlfcn.h>

enum { kMaxSharedMemoryPerMultiprocessor = 81 };  // cudaDevAttrMaxSharedMemoryPerMultiprocessor

typedef int (*get_attribute_fn)(int* value, int attr, int device);

static int smem_per_sm_limit = 0;

void dc_set_smem_per_sm(int bytes) { smem_per_sm_limit = bytes; }

int dc_smem_per_sm_limit(void) { return smem_per_sm_limit; }

int cudaDeviceGetAttribute(int* value, int attr, int device) {
  static get_attribute_fn real = 0;
  if (real == 0) real = (get_attribute_fn)dlsym(RTLD_NEXT, "cudaDeviceGetAttribute");
  if (real == 0) return 3;  // cudaErrorInitializationError: no CUDA runtime behind the shim
  const int err = real(value, attr, device);
  if (err == 0 && attr == kMaxSharedMemoryPerMultiprocessor && smem_per_sm_limit > 0 &&
      *value > smem_per_sm_limit)
    *value = smem_per_sm_limit;
  return err;
}
