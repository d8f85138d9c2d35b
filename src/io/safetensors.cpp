#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/checkpoint.h"

namespace fathom {

namespace {

using json = nlohmann::json;

const char* json_type(const json& j) { return j.type_name(); }

// Reads a non-negative integer that fits in int64; returns false otherwise.
bool as_nonneg_i64(const json& j, int64_t& out) {
  if (j.is_number_unsigned()) {
    uint64_t v = j.get<uint64_t>();
    if (v > uint64_t(std::numeric_limits<int64_t>::max())) return false;
    out = int64_t(v);
    return true;
  }
  if (j.is_number_integer()) {
    int64_t v = j.get<int64_t>();
    if (v < 0) return false;
    out = v;
    return true;
  }
  return false;
}

std::string offsets_str(int64_t b, int64_t e) {
  std::string s = "[";
  s += std::to_string(b);
  s += ", ";
  s += std::to_string(e);
  s += "]";
  return s;
}

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::filesystem::path& path) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->label_ = path.string();
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(f->label_, ": cannot open: ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    fail(f->label_, ": cannot stat: ", std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(f->label_, ": not a regular file");
  }
  f->size_ = size_t(st.st_size);
  if (f->size_ > 0) {
    void* p = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      fail(f->label_, ": cannot mmap ", f->size_, " bytes: ", std::strerror(e));
    }
    f->mapping_ = p;
    f->base_ = static_cast<const std::byte*>(p);
  }
  ::close(fd);
  f->parse();
  return f;
}

std::unique_ptr<SafetensorsFile> SafetensorsFile::from_bytes(std::vector<uint8_t> bytes, std::string label) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->label_ = std::move(label);
  f->owned_ = std::move(bytes);
  f->base_ = reinterpret_cast<const std::byte*>(f->owned_.data());
  f->size_ = f->owned_.size();
  f->parse();
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_) ::munmap(mapping_, size_);
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  auto it = tensors_.find(std::string(name));
  return it == tensors_.end() ? nullptr : &it->second;
}

std::span<const std::byte> SafetensorsFile::bytes(const TensorInfo& t) const {
  return {data_ + t.offset, size_t(t.nbytes)};
}

void SafetensorsFile::parse() {
  const std::string& L = label_;
  if (size_ < 8) fail(L, ": file is ", size_, " bytes, shorter than the 8-byte header length field");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | uint64_t(uint8_t(base_[i]));
  const uint64_t avail = uint64_t(size_) - 8;
  if (n > avail)
    fail(L, ": header length ", n, " extends past the end of the file (", size_, " bytes, ", avail,
         " after the length field)");
  if (n == 0) fail(L, ": header is empty (header length 0)");
  const char* hb = reinterpret_cast<const char*>(base_ + 8);
  json header = json::parse(hb, hb + n, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded()) fail(L, ": header is not valid JSON");
  if (!header.is_object()) fail(L, ": header is a JSON ", json_type(header), ", expected an object");

  data_ = base_ + 8 + n;
  const uint64_t data_size = avail - n;

  for (const auto& item : header.items()) {
    const std::string& key = item.key();
    const json& val = item.value();
    if (key == "__metadata__") {
      if (val.is_null()) continue;
      if (!val.is_object()) fail(L, ": __metadata__ is a JSON ", json_type(val), ", expected an object");
      for (auto& [mk, mv] : val.items()) {
        if (!mv.is_string())
          fail(L, ": __metadata__ entry '", mk, "' is a JSON ", json_type(mv), ", expected a string");
        metadata_[mk] = mv.get<std::string>();
      }
      continue;
    }
    auto bad = [&](const auto&... parts) { fail(L, ": tensor '", key, "': ", parts...); };
    if (!val.is_object()) bad("entry is a JSON ", json_type(val), ", expected an object");
    auto dt = val.find("dtype");
    auto sh = val.find("shape");
    auto off = val.find("data_offsets");
    if (dt == val.end()) bad("missing 'dtype'");
    if (sh == val.end()) bad("missing 'shape'");
    if (off == val.end()) bad("missing 'data_offsets'");
    if (!dt->is_string()) bad("'dtype' is a JSON ", json_type(*dt), ", expected a string");
    auto dtype = parse_dtype(dt->get_ref<const std::string&>());
    if (!dtype) bad("unknown dtype '", dt->get_ref<const std::string&>(), "'");
    if (!sh->is_array()) bad("'shape' is a JSON ", json_type(*sh), ", expected an array");
    TensorInfo t;
    t.name = key;
    t.dtype = *dtype;
    uint64_t numel = 1;
    bool overflow = false;
    for (size_t i = 0; i < sh->size(); ++i) {
      const json& d = (*sh)[i];
      int64_t v = 0;
      if (!as_nonneg_i64(d, v)) {
        if (d.is_number_integer()) bad("negative dimension ", d.get<int64_t>(), " in shape");
        bad("shape dimension ", i, " is not a non-negative integer");
      }
      t.shape.push_back(v);
      if (__builtin_mul_overflow(numel, uint64_t(v), &numel)) overflow = true;
    }
    uint64_t nbytes = 0;
    if (overflow || __builtin_mul_overflow(numel, uint64_t(dtype_size(*dtype)), &nbytes) ||
        numel > uint64_t(std::numeric_limits<int64_t>::max()))
      bad("shape ", shape_str(t.shape), " is too large");
    if (!off->is_array() || off->size() != 2)
      bad("'data_offsets' must be an array of two integers [begin, end]");
    int64_t b = 0, e = 0;
    if (!as_nonneg_i64((*off)[0], b) || !as_nonneg_i64((*off)[1], e))
      bad("'data_offsets' must hold two non-negative integers");
    if (b > e) bad("data_offsets ", offsets_str(b, e), " have begin > end");
    if (uint64_t(e) > data_size)
      bad("data_offsets ", offsets_str(b, e), " extend past the end of the data region (", data_size,
          " bytes)");
    if (uint64_t(e - b) != nbytes)
      bad("shape ", shape_str(t.shape), " x ", dtype_name(*dtype), " needs ", nbytes,
          " bytes but data_offsets ", offsets_str(b, e), " span ", uint64_t(e - b), " bytes");
    t.offset = uint64_t(b);
    t.nbytes = nbytes;
    tensors_.emplace(key, std::move(t));
  }

  // Overlap check over ranges sorted by begin (empty tensors cannot overlap anything).
  std::vector<const TensorInfo*> order;
  order.reserve(tensors_.size());
  for (auto& [k, t] : tensors_)
    if (t.nbytes > 0) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->offset != b->offset ? a->offset < b->offset : a->name < b->name;
  });
  for (size_t i = 1; i < order.size(); ++i) {
    const TensorInfo* p = order[i - 1];
    const TensorInfo* c = order[i];
    if (p->offset + p->nbytes > c->offset)
      fail(L, ": tensor '", c->name, "': data_offsets [", c->offset, ", ", c->offset + c->nbytes,
           "] overlap tensor '", p->name, "' [", p->offset, ", ", p->offset + p->nbytes, "]");
  }
}

}  // namespace fathom
