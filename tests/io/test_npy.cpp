#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "io/npy.h"
#include "io/safetensors_writer.h"

using namespace fathom;
using namespace fathom::testutil;
using ::testing::HasSubstr;

TEST(Npy, RoundTrip) {
  TempDir d;
  std::vector<float> v = {1, 2, 3, 4, 5, 6};
  for (auto shape : std::vector<std::vector<int64_t>>{{2, 3}, {6}, {1, 2, 3}}) {
    write_npy_f32(d / "a.npy", v.data(), shape);
    auto a = read_npy_f32(d / "a.npy");
    EXPECT_EQ(a.shape, shape);
    EXPECT_EQ(a.data, v);
    EXPECT_EQ(std::filesystem::file_size(d / "a.npy") % 64, 24u % 64);  // 64-aligned header + 24 data bytes
  }
  float s = 7.f;
  write_npy_f32(d / "s.npy", &s, {});
  auto a = read_npy_f32(d / "s.npy");
  EXPECT_TRUE(a.shape.empty());
  EXPECT_EQ(a.data, std::vector<float>{7.f});
}

TEST(Npy, HeaderFormat) {
  TempDir d;
  float v[2] = {1, 2};
  write_npy_f32(d / "a.npy", v, {2});
  std::ifstream in(d / "a.npy", std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(s.substr(1, 5), "NUMPY");
  EXPECT_THAT(s, HasSubstr("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }"));
}

TEST(Npy, Errors) {
  TempDir d;
  write_text(d / "bad.npy", "hello");
  try {
    read_npy_f32(d / "bad.npy");
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("bad.npy: not a .npy file"));
  }
  std::string hdr = "{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }";
  std::string f = std::string("\x93NUMPY\x01\x00", 8) + char(hdr.size()) + '\0' + hdr + std::string(8, '\0');
  write_text(d / "f8.npy", f);
  try {
    read_npy_f32(d / "f8.npy");
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("is not little-endian float32"));
  }
  float v[4] = {1, 2, 3, 4};
  write_npy_f32(d / "t.npy", v, {4});
  std::filesystem::resize_file(d / "t.npy", std::filesystem::file_size(d / "t.npy") - 4);
  try {
    read_npy_f32(d / "t.npy");
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("t.npy: .npy data is 12 bytes"));
  }
}
