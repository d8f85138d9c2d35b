// Test helper: builds .safetensors bytes/files and checkpoint folders in a temp dir.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace fathom::testutil {

struct TensorSpec {
  std::string name;
  std::string dtype;  // safetensors spelling ("F32", "BF16", ...), may be invalid on purpose
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;
};

// Raw file: u64 LE header length, header text, data region.
inline std::vector<uint8_t> raw_safetensors(const std::string& header, const std::vector<uint8_t>& data = {}) {
  const uint64_t n = header.size();
  std::vector<uint8_t> out(8 + header.size() + data.size());
  for (int i = 0; i < 8; ++i) out[size_t(i)] = uint8_t(n >> (8 * i));
  if (!header.empty()) std::memcpy(out.data() + 8, header.data(), header.size());
  if (!data.empty()) std::memcpy(out.data() + 8 + header.size(), data.data(), data.size());
  return out;
}

// Lays tensors out back to back in the given order; offsets derive from data sizes.
inline std::vector<uint8_t> build_safetensors(const std::vector<TensorSpec>& tensors,
                                              const std::map<std::string, std::string>& metadata = {}) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  std::vector<uint8_t> data;
  for (const auto& t : tensors) {
    uint64_t b = data.size();
    data.insert(data.end(), t.data.begin(), t.data.end());
    h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {b, uint64_t(data.size())}}};
  }
  std::string header = h.dump();
  while (header.size() % 8) header += ' ';  // safetensors pads the header with spaces
  return raw_safetensors(header, data);
}

template <class T>
std::vector<uint8_t> as_bytes(const std::vector<T>& v) {
  std::vector<uint8_t> out(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(out.data(), v.data(), out.size());
  return out;
}
inline std::vector<uint8_t> f32_bytes(const std::vector<float>& v) { return as_bytes(v); }
inline std::vector<uint8_t> bf16_bytes(const std::vector<float>& v) {
  std::vector<uint16_t> h;
  for (float f : v) h.push_back(f32_to_bf16(f));
  return as_bytes(h);
}
inline std::vector<uint8_t> zeros(size_t n) { return std::vector<uint8_t>(n, 0); }

// Tensor of `dtype` with the given shape filled with zero bytes.
inline TensorSpec zero_tensor(const std::string& name, DType dtype, std::vector<int64_t> shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return {name, std::string(dtype_name(dtype)), std::move(shape), zeros(size_t(n) * dtype_size(dtype))};
}

inline void write_bytes(const std::filesystem::path& p, const std::vector<uint8_t>& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}
inline void write_text(const std::filesystem::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
}

// A fresh folder under the system temp dir, removed on destruction.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() /
            ("fathom_test_" + std::to_string(::getpid()) + "_" + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

}  // namespace fathom::testutil
