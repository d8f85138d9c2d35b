// Reading the fixtures' goldens.safetensors (written by tools/make_fixtures.py) in tests, and the
// fixtures folder (FATHOM_FIXTURES_DIR in the environment overrides the checked-in one).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "io/safetensors.h"

namespace fathom::testing {

inline std::filesystem::path fixtures_dir() {
  const char* env = std::getenv("FATHOM_FIXTURES_DIR");
  return env ? std::filesystem::path(env) : std::filesystem::path(FATHOM_FIXTURES_DIR);
}

// A float tensor converted to fp32; empty when absent.
inline std::vector<float> read_f32(const SafetensorsFile& f, const std::string& name) {
  const TensorInfo* t = f.find(name);
  if (!t) return {};
  std::vector<float> v(t->numel());
  convert_to_f32(t->dtype, f.bytes(*t).data(), v.data(), v.size());
  return v;
}

// An I32 or I64 tensor as int32; empty when absent.
inline std::vector<int32_t> read_i32(const SafetensorsFile& f, const std::string& name) {
  const TensorInfo* t = f.find(name);
  if (!t) return {};
  std::vector<int32_t> v(t->numel());
  if (t->dtype == DType::I32) {
    std::memcpy(v.data(), f.bytes(*t).data(), v.size() * 4);
  } else {
    std::vector<int64_t> w(t->numel());
    std::memcpy(w.data(), f.bytes(*t).data(), w.size() * 8);
    std::copy(w.begin(), w.end(), v.begin());
  }
  return v;
}

}  // namespace fathom::testing
