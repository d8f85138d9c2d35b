// Zero-copy reader for .safetensors files (memory-mapped).
// Format: u64 little-endian header length N, N bytes of JSON header, then the data region.
// Every validation failure throws fathom::Error naming the file (and tensor) and the problem.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"

namespace fathom {

struct TensorInfo {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // from the start of the data region
  uint64_t nbytes = 0;
  int64_t numel() const;
};

class SafetensorsFile {
 public:
  // Maps the file and validates the header: JSON well-formed, known dtypes, shape x dtype
  // size == byte range, ranges inside the data region, no overlaps.
  static std::unique_ptr<SafetensorsFile> open(const std::filesystem::path& path);
  // Same validation over bytes in memory (used by tests and the fuzzer); `label` names it in errors.
  static std::unique_ptr<SafetensorsFile> from_bytes(std::vector<uint8_t> bytes, std::string label);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& label() const { return label_; }  // the path, or the label given
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorInfo* find(std::string_view name) const;
  std::span<const std::byte> bytes(const TensorInfo& t) const;
  // Where a tensor's bytes start in the file (for readers that pread instead of touching the
  // mapping, which would count the pages in the process's resident memory).
  uint64_t file_offset(const TensorInfo& t) const { return uint64_t(data_ - base_) + t.offset; }

 private:
  SafetensorsFile() = default;
  void parse();

  std::string label_;
  const std::byte* base_ = nullptr;  // whole file
  size_t size_ = 0;
  void* mapping_ = nullptr;  // non-null when mmapped
  std::vector<uint8_t> owned_;
  const std::byte* data_ = nullptr;  // start of the data region
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace fathom
