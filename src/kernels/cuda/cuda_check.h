// Error checking for CUDA runtime and cuBLAS calls: failures become fathom::Error naming the
// call, so a bad launch is reported where it happened instead of at the next sync.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include "core/error.h"

#define FATHOM_CUDA_CHECK(expr)                                                                    \
  do {                                                                                             \
    cudaError_t fathom_err_ = (expr);                                                              \
    if (fathom_err_ != cudaSuccess)                                                                \
      ::fathom::fail(#expr, " failed: ", cudaGetErrorString(fathom_err_), " (", __FILE__, ":", __LINE__, ")"); \
  } while (0)

#define FATHOM_CUBLAS_CHECK(expr)                                                                  \
  do {                                                                                             \
    cublasStatus_t fathom_st_ = (expr);                                                            \
    if (fathom_st_ != CUBLAS_STATUS_SUCCESS)                                                       \
      ::fathom::fail(#expr, " failed with cuBLAS status ", int(fathom_st_), " (", __FILE__, ":", __LINE__, ")"); \
  } while (0)

// After a kernel launch: catches bad launch configurations immediately.
#define FATHOM_CUDA_LAUNCH_CHECK() FATHOM_CUDA_CHECK(cudaGetLastError())
