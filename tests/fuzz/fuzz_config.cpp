// libFuzzer target: arbitrary bytes as config.json / generation_config.json / hf_quant_config.json.
// The input is split at the first NUL byte: before = config.json, after = the second file.
// Only fathom::Error may escape; anything else is a bug.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "io/model_config.h"
#include "io/quant_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* p = reinterpret_cast<const char*>(data);
  const char* nul = std::find(p, p + size, '\0');
  std::string first(p, nul);
  std::string second = nul == p + size ? std::string() : std::string(nul + 1, p + size);
  try {
    auto c = fathom::ModelConfig::parse(first, second, "config.json");
    for (int i = 0; i < c.num_hidden_layers; ++i) (void)c.is_moe_layer(i);
    (void)c.rotary_dim();
    (void)c.num_full_attention_layers();
  } catch (const fathom::Error&) {
  }
  try {
    auto q = fathom::QuantConfig::parse(first, second, "fuzz");
    (void)q.expects_quantized("model.layers.0.mlp.experts.0.up_proj");
    (void)q.expects_quantized(first.substr(0, 64));
  } catch (const fathom::Error&) {
  }
  try {
    auto q = fathom::QuantConfig::parse("{}", first, "fuzz");
    for (const auto& m : q.exclude_modules) (void)fathom::wildcard_match(m, second.substr(0, 256));
  } catch (const fathom::Error&) {
  }
  return 0;
}
