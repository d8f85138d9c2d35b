// libFuzzer target: arbitrary bytes as a .safetensors file. Only fathom::Error may escape the
// parser; any other exception, crash or sanitizer report is a bug.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto f = fathom::SafetensorsFile::from_bytes(std::vector<uint8_t>(data, data + size), "fuzz.safetensors");
    // Touch every tensor's bytes so out-of-range spans are caught by ASan.
    volatile uint8_t sink = 0;
    for (const auto& [name, t] : f->tensors()) {
      auto b = f->bytes(t);
      if (!b.empty()) sink = sink ^ uint8_t(b.front()) ^ uint8_t(b.back());
      (void)t.numel();
    }
    (void)sink;
  } catch (const fathom::Error&) {
  }
  return 0;
}
