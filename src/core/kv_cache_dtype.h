// The element type of the paged KV cache (--kv-cache-dtype, vLLM's flag and values): bf16, or
// OCP FP8 E4M3 with a per-tensor scale per layer (k_scale / v_scale: a stored value is
// e4m3(x / scale), read back as e4m3 * scale), which halves the cache's bytes per token.
#pragma once
#include <cstdint>
#include <string_view>

namespace fathom {

enum class KvCacheDtype : uint8_t { Bf16, Fp8E4M3 };

// Bytes of one cached K or V value.
inline int kv_cache_dtype_bytes(KvCacheDtype t) { return t == KvCacheDtype::Fp8E4M3 ? 1 : 2; }
// "bf16" / "fp8_e4m3": as logs and reports print it.
const char* kv_cache_dtype_name(KvCacheDtype t);

// The flag's values: auto, bf16, fp8, fp8_e4m3 (case-sensitive, as vLLM's).
bool is_kv_cache_dtype_flag(std::string_view flag);
// The dtype a flag value asks for; "auto" follows the checkpoint: fp8 when its quantization
// config's kv_cache_quant_algo is FP8 (any case), else bf16. Throws on an unknown value.
KvCacheDtype resolve_kv_cache_dtype(std::string_view flag, std::string_view kv_cache_quant_algo);

}  // namespace fathom
