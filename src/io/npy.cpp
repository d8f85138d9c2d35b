#include "io/npy.h"

#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>

#include "core/error.h"

namespace fathom {

namespace fs = std::filesystem;

void write_npy_f32(const fs::path& path, const float* data, const std::vector<int64_t>& shape) {
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (";
  int64_t n = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    FATHOM_CHECK(shape[i] >= 0, path.string(), ": negative dimension ", shape[i]);
    dict += std::to_string(shape[i]);
    if (shape.size() == 1 || i + 1 < shape.size()) dict += ",";
    if (i + 1 < shape.size()) dict += " ";
    n *= shape[i];
  }
  dict += "), }";
  // magic(6) + version(2) + len(2) + dict + padding + '\n' is a multiple of 64.
  size_t total = 10 + dict.size() + 1;
  dict.append((64 - total % 64) % 64, ' ');
  dict += '\n';
  FATHOM_CHECK(dict.size() <= 65535, path.string(), ": .npy header too long");
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  FATHOM_CHECK(bool(out), path.string(), ": cannot open for writing");
  const char magic[8] = {'\x93', 'N', 'U', 'M', 'P', 'Y', 1, 0};
  out.write(magic, 8);
  const uint16_t hl = uint16_t(dict.size());
  const char hlb[2] = {char(hl & 0xff), char(hl >> 8)};
  out.write(hlb, 2);
  out.write(dict.data(), std::streamsize(dict.size()));
  if (n > 0) out.write(reinterpret_cast<const char*>(data), std::streamsize(n * 4));
  FATHOM_CHECK(bool(out), path.string(), ": write failed");
}

namespace {

// Finds the value text after 'key': in the header dict.
std::string dict_value(const std::string& h, const std::string& key, const std::string& label) {
  auto k = h.find("'" + key + "'");
  if (k == std::string::npos) fail(label, ": .npy header lacks '", key, "'");
  auto colon = h.find(':', k);
  if (colon == std::string::npos) fail(label, ": malformed .npy header");
  size_t b = colon + 1;
  while (b < h.size() && h[b] == ' ') ++b;
  size_t e = b;
  if (b < h.size() && h[b] == '(') {
    e = h.find(')', b);
    if (e == std::string::npos) fail(label, ": malformed .npy shape");
    return h.substr(b, e - b + 1);
  }
  while (e < h.size() && h[e] != ',' && h[e] != '}') ++e;
  return h.substr(b, e - b);
}

}  // namespace

NpyArray read_npy_f32(const fs::path& path) {
  const std::string label = path.string();
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(label, ": cannot open");
  std::ostringstream os;
  os << in.rdbuf();
  const std::string buf = os.str();
  if (buf.size() < 10 || std::memcmp(buf.data(), "\x93NUMPY", 6) != 0) fail(label, ": not a .npy file");
  const int major = uint8_t(buf[6]);
  size_t hlen, hstart;
  if (major == 1) {
    hlen = uint8_t(buf[8]) | (size_t(uint8_t(buf[9])) << 8);
    hstart = 10;
  } else if (major == 2 || major == 3) {
    if (buf.size() < 12) fail(label, ": truncated .npy header");
    hlen = uint8_t(buf[8]) | (size_t(uint8_t(buf[9])) << 8) | (size_t(uint8_t(buf[10])) << 16) |
           (size_t(uint8_t(buf[11])) << 24);
    hstart = 12;
  } else {
    fail(label, ": unsupported .npy version ", major);
  }
  if (hstart + hlen > buf.size()) fail(label, ": .npy header length past the end of the file");
  const std::string h = buf.substr(hstart, hlen);
  const std::string descr = dict_value(h, "descr", label);
  if (descr != "'<f4'" && descr != "'float32'")
    fail(label, ": .npy dtype ", descr, " is not little-endian float32 ('<f4')");
  if (dict_value(h, "fortran_order", label) != "False") fail(label, ": Fortran-order .npy is not supported");
  const std::string sh = dict_value(h, "shape", label);
  NpyArray a;
  int64_t n = 1;
  size_t i = 1;
  while (i < sh.size()) {
    while (i < sh.size() && (sh[i] == ' ' || sh[i] == ',')) ++i;
    if (i >= sh.size() || sh[i] == ')') break;
    if (sh[i] < '0' || sh[i] > '9') fail(label, ": malformed .npy shape ", sh);
    int64_t d = 0;
    while (i < sh.size() && sh[i] >= '0' && sh[i] <= '9') {
      if (d > (std::numeric_limits<int64_t>::max() - 9) / 10) fail(label, ": .npy dimension too large");
      d = d * 10 + (sh[i++] - '0');
    }
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / 4 / d) fail(label, ": .npy array too large");
    n *= d;
    a.shape.push_back(d);
  }
  const size_t data_off = hstart + hlen;
  if (buf.size() - data_off < size_t(n) * 4)
    fail(label, ": .npy data is ", buf.size() - data_off, " bytes, shape ", sh, " needs ", n * 4);
  a.data.resize(size_t(n));
  if (n > 0) std::memcpy(a.data.data(), buf.data() + data_off, size_t(n) * 4);
  return a;
}

}  // namespace fathom
