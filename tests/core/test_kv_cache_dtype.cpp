// --kv-cache-dtype's values and the resolution of auto from a checkpoint's kv_cache_quant_algo.
#include <gtest/gtest.h>

#include "core/kv_cache_dtype.h"

namespace fathom {
namespace {

TEST(KvCacheDtype, ResolvesFlagValues) {
  EXPECT_EQ(resolve_kv_cache_dtype("bf16", "FP8"), KvCacheDtype::Bf16);  // explicit beats the checkpoint
  EXPECT_EQ(resolve_kv_cache_dtype("fp8", ""), KvCacheDtype::Fp8E4M3);
  EXPECT_EQ(resolve_kv_cache_dtype("fp8_e4m3", ""), KvCacheDtype::Fp8E4M3);
  EXPECT_EQ(resolve_kv_cache_dtype("auto", ""), KvCacheDtype::Bf16);
  EXPECT_EQ(resolve_kv_cache_dtype("auto", "FP8"), KvCacheDtype::Fp8E4M3);
  EXPECT_EQ(resolve_kv_cache_dtype("auto", "fp8"), KvCacheDtype::Fp8E4M3);
  EXPECT_EQ(resolve_kv_cache_dtype("auto", "NVFP4"), KvCacheDtype::Bf16);
  EXPECT_THROW(resolve_kv_cache_dtype("fp8_e5m2", ""), std::runtime_error);
  EXPECT_THROW(resolve_kv_cache_dtype("FP8", ""), std::runtime_error);
  EXPECT_EQ(kv_cache_dtype_bytes(KvCacheDtype::Bf16), 2);
  EXPECT_EQ(kv_cache_dtype_bytes(KvCacheDtype::Fp8E4M3), 1);
  EXPECT_STREQ(kv_cache_dtype_name(KvCacheDtype::Fp8E4M3), "fp8_e4m3");
}

}  // namespace
}  // namespace fathom
