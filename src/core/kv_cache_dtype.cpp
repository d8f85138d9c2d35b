#include "core/kv_cache_dtype.h"

#include <cctype>

#include "core/error.h"

namespace fathom {

const char* kv_cache_dtype_name(KvCacheDtype t) { return t == KvCacheDtype::Fp8E4M3 ? "fp8_e4m3" : "bf16"; }

bool is_kv_cache_dtype_flag(std::string_view flag) {
  return flag == "auto" || flag == "bf16" || flag == "fp8" || flag == "fp8_e4m3";
}

KvCacheDtype resolve_kv_cache_dtype(std::string_view flag, std::string_view kv_cache_quant_algo) {
  FATHOM_CHECK(is_kv_cache_dtype_flag(flag), "--kv-cache-dtype must be auto, bf16, fp8 or fp8_e4m3, got '", flag,
               "'");
  if (flag == "bf16") return KvCacheDtype::Bf16;
  if (flag == "fp8" || flag == "fp8_e4m3") return KvCacheDtype::Fp8E4M3;
  auto upper = [](char c) { return char(std::toupper(static_cast<unsigned char>(c))); };
  const bool fp8 = kv_cache_quant_algo.size() == 3 && upper(kv_cache_quant_algo[0]) == 'F' &&
                   upper(kv_cache_quant_algo[1]) == 'P' && kv_cache_quant_algo[2] == '8';
  return fp8 ? KvCacheDtype::Fp8E4M3 : KvCacheDtype::Bf16;
}

}  // namespace fathom
