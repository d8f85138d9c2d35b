// A Hugging Face checkpoint folder: one model.safetensors, or shards listed in
// model.safetensors.index.json (weight_map), or a folder of *.safetensors files.
#pragma once
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "io/safetensors.h"

namespace fathom {

class Checkpoint {
 public:
  // Throws fathom::Error when the folder, the index or any shard is missing or invalid,
  // or when the index names a tensor that its shard does not hold.
  static std::shared_ptr<Checkpoint> open(const std::filesystem::path& dir);

  const std::filesystem::path& dir() const { return dir_; }
  bool has(std::string_view name) const;
  // Throws "missing tensor NAME in DIR" when absent.
  const TensorInfo& info(std::string_view name) const;
  std::span<const std::byte> bytes(std::string_view name) const;
  // The file holding the tensor (for error messages).
  const std::string& file_of(std::string_view name) const;
  std::vector<std::string> names() const;  // sorted

  // The shard file and byte range holding a tensor (validated against the file's size at open).
  struct Location {
    std::filesystem::path path;
    uint64_t offset = 0, bytes = 0;
  };
  Location location(std::string_view name) const;

  // Checks dtype/shape and converts a float tensor to fp32. Errors name the tensor, its file,
  // and the expected vs. found shape or dtype.
  std::vector<float> read_f32(std::string_view name, const std::vector<int64_t>& expected_shape) const;
  // Checks that the tensor exists with exactly this dtype and shape; throws otherwise.
  const TensorInfo& expect(std::string_view name, DType dtype, const std::vector<int64_t>& shape) const;

 private:
  std::filesystem::path dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::vector<std::string> file_names_;  // files_[i]'s name relative to dir_ (for messages)
  std::map<std::string, std::pair<const SafetensorsFile*, const TensorInfo*>, std::less<>> index_;
};

std::string shape_str(const std::vector<int64_t>& shape);  // "[2, 3]"

}  // namespace fathom
