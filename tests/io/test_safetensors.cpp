#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"

using namespace fathom;
using namespace fathom::testutil;
using ::testing::HasSubstr;

namespace {

std::string error_of(const std::vector<uint8_t>& bytes, const std::string& label = "test.safetensors") {
  try {
    SafetensorsFile::from_bytes(bytes, label);
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

std::vector<uint8_t> header_only(const std::string& json, size_t data_bytes = 0) {
  return raw_safetensors(json, zeros(data_bytes));
}

}  // namespace

TEST(Safetensors, ReadsAllDtypes) {
  std::vector<TensorSpec> ts = {
      {"f32", "F32", {2}, f32_bytes({1.5f, -2.f})},
      {"f16", "F16", {2}, as_bytes(std::vector<uint16_t>{0x3c00, 0xc000})},    // 1.0, -2.0
      {"bf16", "BF16", {2}, as_bytes(std::vector<uint16_t>{0x3f80, 0x4049})},  // 1.0, 3.140625
      {"f8", "F8_E4M3", {4}, {0x38, 0x40, 0xb8, 0x01}},                        // 1.0, 2.0, -1.0, 2^-9
      {"u8", "U8", {3}, {1, 2, 255}},
      {"i8", "I8", {1}, {0xff}},
      {"i32", "I32", {1}, as_bytes(std::vector<int32_t>{-7})},
      {"i64", "I64", {1}, as_bytes(std::vector<int64_t>{1ll << 40})},
      {"bool", "BOOL", {2}, {0, 1}},
  };
  auto f = SafetensorsFile::from_bytes(build_safetensors(ts), "all.safetensors");
  ASSERT_EQ(f->tensors().size(), ts.size());
  auto get = [&](const char* n) {
    const TensorInfo* t = f->find(n);
    EXPECT_NE(t, nullptr) << n;
    std::vector<float> out(size_t(t->numel()));
    convert_to_f32(t->dtype, f->bytes(*t).data(), out.data(), out.size());
    return out;
  };
  EXPECT_EQ(get("f32"), (std::vector<float>{1.5f, -2.f}));
  EXPECT_EQ(get("f16"), (std::vector<float>{1.f, -2.f}));
  EXPECT_EQ(get("bf16"), (std::vector<float>{1.f, 3.140625f}));
  EXPECT_EQ(get("f8"), (std::vector<float>{1.f, 2.f, -1.f, std::ldexp(1.f, -9)}));
  EXPECT_EQ(f->find("u8")->dtype, DType::U8);
  EXPECT_EQ(f->find("i8")->dtype, DType::I8);
  EXPECT_EQ(f->find("i32")->dtype, DType::I32);
  EXPECT_EQ(f->find("i64")->dtype, DType::I64);
  EXPECT_EQ(f->find("i64")->nbytes, 8u);
  EXPECT_EQ(f->find("bool")->dtype, DType::BOOL);
  int64_t v;
  std::memcpy(&v, f->bytes(*f->find("i64")).data(), 8);
  EXPECT_EQ(v, 1ll << 40);
  EXPECT_EQ(f->find("missing"), nullptr);
}

TEST(Safetensors, Fp8E4M3NanAndMax) {
  EXPECT_EQ(fp8_e4m3_to_f32(0x7e), 448.f);
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0x7f)));
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.00390625f)), 1.f);  // ties to even
}

TEST(Safetensors, MetadataAndScalarAndEmptyTensors) {
  std::vector<TensorSpec> ts = {{"scalar", "F32", {}, f32_bytes({0.25f})}, {"empty", "BF16", {0, 4}, {}}};
  auto f = SafetensorsFile::from_bytes(build_safetensors(ts, {{"format", "pt"}}), "m.safetensors");
  EXPECT_EQ(f->metadata().at("format"), "pt");
  EXPECT_EQ(f->find("scalar")->shape.size(), 0u);
  EXPECT_EQ(f->find("scalar")->numel(), 1);
  EXPECT_EQ(f->find("empty")->numel(), 0);
  EXPECT_EQ(f->find("empty")->nbytes, 0u);
  EXPECT_EQ(f->label(), "m.safetensors");
}

TEST(Safetensors, OpenMapsFile) {
  TempDir d;
  write_bytes(d / "x.safetensors", build_safetensors({{"w", "F32", {2, 2}, f32_bytes({1, 2, 3, 4})}}));
  auto f = SafetensorsFile::open(d / "x.safetensors");
  auto b = f->bytes(*f->find("w"));
  ASSERT_EQ(b.size(), 16u);
  float x[4];
  std::memcpy(x, b.data(), 16);
  EXPECT_EQ(x[3], 4.f);
}

TEST(Safetensors, OpenMissingFile) {
  try {
    SafetensorsFile::open("/nonexistent/dir/model.safetensors");
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("/nonexistent/dir/model.safetensors: cannot open"));
  }
}

TEST(Safetensors, FileShorterThan8Bytes) {
  EXPECT_THAT(error_of({1, 2, 3}), HasSubstr("test.safetensors: file is 3 bytes, shorter than the 8-byte header"));
  TempDir d;
  write_bytes(d / "empty.safetensors", {});
  try {
    SafetensorsFile::open(d / "empty.safetensors");
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("empty.safetensors: file is 0 bytes"));
  }
}

TEST(Safetensors, HeaderLengthPastEnd) {
  auto bytes = raw_safetensors("{}");
  bytes[0] = 200;  // claims 200 header bytes, only 2 present
  EXPECT_THAT(error_of(bytes), HasSubstr("test.safetensors: header length 200 extends past the end of the file (10 bytes"));
  std::vector<uint8_t> huge(16, 0xff);
  EXPECT_THAT(error_of(huge), HasSubstr("header length 18446744073709551615 extends past the end of the file"));
}

TEST(Safetensors, BadJsonHeader) {
  EXPECT_THAT(error_of(header_only("{\"a\": ")), HasSubstr("test.safetensors: header is not valid JSON"));
  EXPECT_THAT(error_of(header_only("[1, 2]")), HasSubstr("test.safetensors: header is a JSON array, expected an object"));
  EXPECT_THAT(error_of(raw_safetensors("")), HasSubstr("header is empty"));
}

TEST(Safetensors, MissingFields) {
  EXPECT_THAT(error_of(header_only(R"({"x.weight": {"shape": [1], "data_offsets": [0, 4]}})", 4)),
              HasSubstr("test.safetensors: tensor 'x.weight': missing 'dtype'"));
  EXPECT_THAT(error_of(header_only(R"({"x.weight": {"dtype": "F32", "data_offsets": [0, 4]}})", 4)),
              HasSubstr("tensor 'x.weight': missing 'shape'"));
  EXPECT_THAT(error_of(header_only(R"({"x.weight": {"dtype": "F32", "shape": [1]}})", 4)),
              HasSubstr("tensor 'x.weight': missing 'data_offsets'"));
  EXPECT_THAT(error_of(header_only(R"({"x.weight": 5})")), HasSubstr("tensor 'x.weight': entry is a JSON number"));
  EXPECT_THAT(error_of(header_only(R"({"x": {"dtype": 3, "shape": [1], "data_offsets": [0, 4]}})", 4)),
              HasSubstr("tensor 'x': 'dtype' is a JSON number, expected a string"));
  EXPECT_THAT(error_of(header_only(R"({"x": {"dtype": "F32", "shape": 1, "data_offsets": [0, 4]}})", 4)),
              HasSubstr("tensor 'x': 'shape' is a JSON number, expected an array"));
  EXPECT_THAT(error_of(header_only(R"({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})", 4)),
              HasSubstr("tensor 'x': 'data_offsets' must be an array of two integers"));
  EXPECT_THAT(error_of(header_only(R"({"x": {"dtype": "F32", "shape": [1], "data_offsets": [-1, 4]}})", 4)),
              HasSubstr("tensor 'x': 'data_offsets' must hold two non-negative integers"));
  EXPECT_THAT(error_of(header_only(R"({"x": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", 4)),
              HasSubstr("tensor 'x': shape dimension 0 is not a non-negative integer"));
}

TEST(Safetensors, UnknownDtype) {
  EXPECT_THAT(error_of(header_only(R"({"x.weight": {"dtype": "F4", "shape": [2], "data_offsets": [0, 1]}})", 1)),
              HasSubstr("test.safetensors: tensor 'x.weight': unknown dtype 'F4'"));
}

TEST(Safetensors, NegativeDimension) {
  EXPECT_THAT(error_of(header_only(R"({"x": {"dtype": "F32", "shape": [2, -3], "data_offsets": [0, 4]}})", 4)),
              HasSubstr("tensor 'x': negative dimension -3 in shape"));
}

TEST(Safetensors, ShapeTooLarge) {
  EXPECT_THAT(error_of(header_only(
                  R"({"x": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 4]}})", 4)),
              HasSubstr("tensor 'x': shape [4294967296, 4294967296] is too large"));
}

TEST(Safetensors, SizeMismatch) {
  EXPECT_THAT(error_of(header_only(R"({"x.weight": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 10]}})", 10)),
              HasSubstr("tensor 'x.weight': shape [2, 3] x BF16 needs 12 bytes but data_offsets [0, 10] span 10 bytes"));
}

TEST(Safetensors, BeginAfterEnd) {
  EXPECT_THAT(error_of(header_only(R"({"x": {"dtype": "U8", "shape": [0], "data_offsets": [8, 4]}})", 8)),
              HasSubstr("tensor 'x': data_offsets [8, 4] have begin > end"));
}

TEST(Safetensors, OffsetsPastDataRegion) {
  // Also the "truncated file" case: the header promises 100 bytes, the file holds 64.
  EXPECT_THAT(error_of(header_only(R"({"x.weight": {"dtype": "U8", "shape": [100], "data_offsets": [0, 100]}})", 64),
                       "model-00001-of-00002.safetensors"),
              HasSubstr("model-00001-of-00002.safetensors: tensor 'x.weight': data_offsets [0, 100] extend past the "
                        "end of the data region (64 bytes)"));
}

TEST(Safetensors, TruncatedFileOnDisk) {
  TempDir d;
  auto bytes = build_safetensors({{"a", "F32", {4}, f32_bytes({1, 2, 3, 4})}});
  bytes.resize(bytes.size() - 6);
  write_bytes(d / "cut.safetensors", bytes);
  try {
    SafetensorsFile::open(d / "cut.safetensors");
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("cut.safetensors: tensor 'a': data_offsets [0, 16] extend past the end of the "
                                    "data region (10 bytes)"));
  }
}

TEST(Safetensors, OverlappingOffsets) {
  const char* h = R"({"b": {"dtype": "U8", "shape": [8], "data_offsets": [4, 12]},
                      "a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}})";
  EXPECT_THAT(error_of(header_only(h, 12)),
              HasSubstr("test.safetensors: tensor 'b': data_offsets [4, 12] overlap tensor 'a' [0, 8]"));
  // Touching ranges and empty tensors are fine.
  const char* ok = R"({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                       "e": {"dtype": "U8", "shape": [0], "data_offsets": [2, 2]},
                       "b": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]}})";
  EXPECT_EQ(error_of(header_only(ok, 8)), "<no error>");
}

TEST(Safetensors, BadMetadata) {
  EXPECT_THAT(error_of(header_only(R"({"__metadata__": [1]})")), HasSubstr("__metadata__ is a JSON array"));
  EXPECT_THAT(error_of(header_only(R"({"__metadata__": {"format": 1}})")),
              HasSubstr("__metadata__ entry 'format' is a JSON number, expected a string"));
}
