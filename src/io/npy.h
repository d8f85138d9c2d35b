// Writes and reads NumPy .npy files (version 1.0, little-endian float32, C order).
#pragma once
#include <cstdint>
#include <filesystem>
#include <vector>

namespace fathom {

void write_npy_f32(const std::filesystem::path& path, const float* data, const std::vector<int64_t>& shape);

struct NpyArray {
  std::vector<int64_t> shape;
  std::vector<float> data;
};
NpyArray read_npy_f32(const std::filesystem::path& path);

}  // namespace fathom
