#include "io/checkpoint.h"
#include "io/text_file.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <future>
#include <set>
#include <sstream>

#include "core/error.h"

namespace fathom {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::shared_ptr<Checkpoint> Checkpoint::open(const fs::path& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) fail("checkpoint folder ", dir.string(), " does not exist");
  if (!fs::is_directory(dir, ec)) fail("checkpoint path ", dir.string(), " is not a folder");

  auto ck = std::shared_ptr<Checkpoint>(new Checkpoint());
  ck->dir_ = dir;

  // Files to open, relative to dir, and (for an index) the tensors each must hold.
  std::vector<std::string> files;
  std::map<std::string, std::string> weight_map;  // tensor -> shard
  const fs::path index_path = dir / "model.safetensors.index.json";
  const std::string index_label = index_path.string();
  if (fs::exists(index_path, ec)) {
    json idx = json::parse(read_text_file(index_path), nullptr, false);
    if (idx.is_discarded()) fail(index_label, ": not valid JSON");
    if (!idx.is_object()) fail(index_label, ": expected a JSON object");
    auto wm = idx.find("weight_map");
    if (wm == idx.end()) fail(index_label, ": missing 'weight_map'");
    if (!wm->is_object()) fail(index_label, ": 'weight_map' is a JSON ", wm->type_name(), ", expected an object");
    std::set<std::string> seen;
    for (auto& [tensor, shard] : wm->items()) {
      if (!shard.is_string())
        fail(index_label, ": weight_map entry '", tensor, "' is a JSON ", shard.type_name(), ", expected a string");
      const std::string& s = shard.get_ref<const std::string&>();
      weight_map[tensor] = s;
      if (seen.insert(s).second) {
        if (!fs::is_regular_file(dir / s, ec))
          fail(index_label, ": shard '", s, "' (listed for tensor '", tensor, "') not found in ", dir.string());
        files.push_back(s);
      }
    }
    if (files.empty()) fail(index_label, ": weight_map is empty");
  } else if (fs::exists(dir / "model.safetensors", ec)) {
    files.push_back("model.safetensors");
  } else {
    for (auto& e : fs::directory_iterator(dir, ec)) {
      if (e.path().extension() == ".safetensors" && e.is_regular_file(ec))
        files.push_back(e.path().filename().string());
    }
    std::sort(files.begin(), files.end());
    if (files.empty())
      fail("no weights found in ", dir.string(),
           " (expected model.safetensors, model.safetensors.index.json or *.safetensors files)");
  }

  // Shard headers are parsed in parallel: a 512-expert checkpoint has 100,000s of tensor entries.
  std::vector<std::future<std::unique_ptr<SafetensorsFile>>> opened;
  for (const auto& f : files) opened.push_back(std::async(std::launch::async, [&dir, f] { return SafetensorsFile::open(dir / f); }));
  for (size_t i = 0; i < files.size(); ++i) {
    ck->files_.push_back(opened[i].get());  // rethrows the first shard's error, naming it
    ck->file_names_.push_back(files[i]);
  }
  for (size_t i = 0; i < ck->files_.size(); ++i) {
    const SafetensorsFile* sf = ck->files_[i].get();
    for (const auto& [name, info] : sf->tensors()) {
      auto [it, inserted] = ck->index_.emplace(name, std::make_pair(sf, &info));
      if (!inserted) {
        const std::string& other = ck->file_of(name);
        fail(dir.string(), ": tensor '", name, "' appears in both ", other, " and ", ck->file_names_[i]);
      }
    }
  }
  for (const auto& [tensor, shard] : weight_map) {
    auto it = ck->index_.find(tensor);
    if (it == ck->index_.end() || ck->file_of(tensor) != shard)
      fail(index_label, ": tensor '", tensor, "' is listed in shard '", shard, "' but ", shard,
           " does not hold it");
  }
  return ck;
}

bool Checkpoint::has(std::string_view name) const { return index_.find(name) != index_.end(); }

const TensorInfo& Checkpoint::info(std::string_view name) const {
  auto it = index_.find(name);
  if (it == index_.end()) fail("missing tensor ", name, " in ", dir_.string());
  return *it->second.second;
}

std::span<const std::byte> Checkpoint::bytes(std::string_view name) const {
  auto it = index_.find(name);
  if (it == index_.end()) fail("missing tensor ", name, " in ", dir_.string());
  return it->second.first->bytes(*it->second.second);
}

const std::string& Checkpoint::file_of(std::string_view name) const {
  auto it = index_.find(name);
  if (it == index_.end()) fail("missing tensor ", name, " in ", dir_.string());
  for (size_t i = 0; i < files_.size(); ++i)
    if (files_[i].get() == it->second.first) return file_names_[i];
  return it->second.first->label();
}

Checkpoint::Location Checkpoint::location(std::string_view name) const {
  auto it = index_.find(name);
  if (it == index_.end()) fail("missing tensor ", name, " in ", dir_.string());
  return Location{dir_ / file_of(name), it->second.first->file_offset(*it->second.second), it->second.second->nbytes};
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(index_.size());
  for (const auto& [k, v] : index_) out.push_back(k);
  return out;
}

std::vector<float> Checkpoint::read_f32(std::string_view name, const std::vector<int64_t>& expected_shape) const {
  const TensorInfo& t = info(name);
  if (!is_float(t.dtype))
    fail("tensor '", name, "' in ", file_of(name), ": expected a float dtype (F32, F16, BF16, F8_E4M3), found ",
         dtype_name(t.dtype));
  if (t.shape != expected_shape)
    fail("tensor '", name, "' in ", file_of(name), ": expected shape ", shape_str(expected_shape), ", found ",
         shape_str(t.shape));
  std::vector<float> out(size_t(t.numel()));
  convert_to_f32(t.dtype, bytes(name).data(), out.data(), out.size());
  return out;
}

const TensorInfo& Checkpoint::expect(std::string_view name, DType dtype, const std::vector<int64_t>& shape) const {
  const TensorInfo& t = info(name);
  if (t.dtype != dtype)
    fail("tensor '", name, "' in ", file_of(name), ": expected dtype ", dtype_name(dtype), ", found ",
         dtype_name(t.dtype));
  if (t.shape != shape)
    fail("tensor '", name, "' in ", file_of(name), ": expected shape ", shape_str(shape), ", found ",
         shape_str(t.shape));
  return t;
}

}  // namespace fathom
