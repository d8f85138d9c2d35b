#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "core/error.h"
#include "io/checkpoint.h"
#include "io/safetensors_writer.h"

using namespace fathom;
using namespace fathom::testutil;
using ::testing::HasSubstr;

namespace {

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

// Two shards + index, as written by transformers' save_pretrained.
void write_sharded(const TempDir& d) {
  write_bytes(d / "model-00001-of-00002.safetensors",
              build_safetensors({{"model.embed_tokens.weight", "BF16", {4, 2}, bf16_bytes({1, 2, 3, 4, 5, 6, 7, 8})},
                                 {"model.layers.0.mlp.gate.weight", "F32", {8, 32}, zeros(8 * 32 * 4)}}));
  write_bytes(d / "model-00002-of-00002.safetensors",
              build_safetensors({{"lm_head.weight", "F16", {4, 2}, zeros(16)}}));
  write_text(d / "model.safetensors.index.json", R"({"metadata": {"total_size": 1088}, "weight_map": {
      "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
      "model.layers.0.mlp.gate.weight": "model-00001-of-00002.safetensors",
      "lm_head.weight": "model-00002-of-00002.safetensors"}})");
}

}  // namespace

TEST(Checkpoint, SingleFile) {
  TempDir d;
  write_bytes(d / "model.safetensors", build_safetensors({{"a", "F32", {2}, f32_bytes({1, 2})}}));
  write_bytes(d / "stray.safetensors", build_safetensors({{"b", "F32", {1}, f32_bytes({1})}}));  // ignored
  auto ck = Checkpoint::open(d.path());
  EXPECT_EQ(ck->names(), std::vector<std::string>{"a"});
  EXPECT_EQ(ck->read_f32("a", {2}), (std::vector<float>{1, 2}));
  EXPECT_EQ(ck->file_of("a"), "model.safetensors");
  EXPECT_EQ(ck->dir(), d.path());
}

TEST(Checkpoint, ShardedIndex) {
  TempDir d;
  write_sharded(d);
  auto ck = Checkpoint::open(d.path());
  EXPECT_EQ(ck->names().size(), 3u);
  EXPECT_TRUE(ck->has("lm_head.weight"));
  EXPECT_FALSE(ck->has("nope"));
  EXPECT_EQ(ck->file_of("lm_head.weight"), "model-00002-of-00002.safetensors");
  EXPECT_EQ(ck->read_f32("model.embed_tokens.weight", {4, 2}), (std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(ck->bytes("lm_head.weight").size(), 16u);
  EXPECT_EQ(ck->expect("lm_head.weight", DType::F16, {4, 2}).nbytes, 16u);
  EXPECT_EQ(ck->info("lm_head.weight").dtype, DType::F16);
}

TEST(Checkpoint, FolderOfSafetensors) {
  TempDir d;
  write_bytes(d / "b.safetensors", build_safetensors({{"y", "U8", {1}, {7}}}));
  write_bytes(d / "a.safetensors", build_safetensors({{"x", "U8", {1}, {9}}}));
  auto ck = Checkpoint::open(d.path());
  EXPECT_EQ(ck->names(), (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(ck->file_of("y"), "b.safetensors");
}

TEST(Checkpoint, MissingFolder) {
  EXPECT_THAT(error_of([] { Checkpoint::open("/nonexistent/fathom/model"); }),
              HasSubstr("checkpoint folder /nonexistent/fathom/model does not exist"));
}

TEST(Checkpoint, NoWeights) {
  TempDir d;
  write_text(d / "config.json", "{}");
  EXPECT_THAT(error_of([&] { Checkpoint::open(d.path()); }), HasSubstr("no weights found in " + d.path().string()));
}

TEST(Checkpoint, MissingShard) {
  TempDir d;
  write_sharded(d);
  std::filesystem::remove(d / "model-00002-of-00002.safetensors");
  EXPECT_THAT(error_of([&] { Checkpoint::open(d.path()); }),
              HasSubstr("model.safetensors.index.json: shard 'model-00002-of-00002.safetensors' (listed for tensor "
                        "'lm_head.weight') not found"));
}

TEST(Checkpoint, IndexNamesTensorShardLacks) {
  TempDir d;
  write_sharded(d);
  write_text(d / "model.safetensors.index.json", R"({"weight_map": {
      "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
      "model.norm.weight": "model-00001-of-00002.safetensors",
      "lm_head.weight": "model-00002-of-00002.safetensors"}})");
  EXPECT_THAT(error_of([&] { Checkpoint::open(d.path()); }),
              HasSubstr("tensor 'model.norm.weight' is listed in shard 'model-00001-of-00002.safetensors' but "
                        "model-00001-of-00002.safetensors does not hold it"));
}

TEST(Checkpoint, BadIndex) {
  TempDir d;
  write_sharded(d);
  write_text(d / "model.safetensors.index.json", "{\"weight_map\": ");
  EXPECT_THAT(error_of([&] { Checkpoint::open(d.path()); }), HasSubstr("model.safetensors.index.json: not valid JSON"));
  write_text(d / "model.safetensors.index.json", "{\"metadata\": {}}");
  EXPECT_THAT(error_of([&] { Checkpoint::open(d.path()); }), HasSubstr("missing 'weight_map'"));
}

TEST(Checkpoint, DuplicateTensorAcrossFiles) {
  TempDir d;
  write_bytes(d / "a.safetensors", build_safetensors({{"x", "U8", {1}, {1}}}));
  write_bytes(d / "b.safetensors", build_safetensors({{"x", "U8", {1}, {2}}}));
  EXPECT_THAT(error_of([&] { Checkpoint::open(d.path()); }),
              HasSubstr("tensor 'x' appears in both a.safetensors and b.safetensors"));
}

TEST(Checkpoint, BadShardPropagatesFileName) {
  TempDir d;
  write_sharded(d);
  write_bytes(d / "model-00002-of-00002.safetensors", {1, 2, 3});
  EXPECT_THAT(error_of([&] { Checkpoint::open(d.path()); }),
              HasSubstr("model-00002-of-00002.safetensors: file is 3 bytes"));
}

TEST(Checkpoint, MissingTensor) {
  TempDir d;
  write_sharded(d);
  auto ck = Checkpoint::open(d.path());
  EXPECT_THAT(error_of([&] { ck->info("model.norm.weight"); }),
              HasSubstr("missing tensor model.norm.weight in " + d.path().string()));
  EXPECT_THAT(error_of([&] { ck->read_f32("model.norm.weight", {4}); }), HasSubstr("missing tensor model.norm.weight"));
}

TEST(Checkpoint, WrongShape) {
  TempDir d;
  write_sharded(d);
  auto ck = Checkpoint::open(d.path());
  EXPECT_THAT(error_of([&] { ck->read_f32("model.layers.0.mlp.gate.weight", {8, 64}); }),
              HasSubstr("tensor 'model.layers.0.mlp.gate.weight' in model-00001-of-00002.safetensors: expected shape "
                        "[8, 64], found [8, 32]"));
  EXPECT_THAT(error_of([&] { ck->expect("lm_head.weight", DType::F16, {2, 4}); }),
              HasSubstr("tensor 'lm_head.weight' in model-00002-of-00002.safetensors: expected shape [2, 4], found [4, 2]"));
}

TEST(Checkpoint, WrongDtype) {
  TempDir d;
  write_sharded(d);
  write_bytes(d / "model-00002-of-00002.safetensors", build_safetensors({{"lm_head.weight", "I32", {4, 2}, zeros(32)}}));
  auto ck = Checkpoint::open(d.path());
  EXPECT_THAT(error_of([&] { ck->read_f32("lm_head.weight", {4, 2}); }),
              HasSubstr("tensor 'lm_head.weight' in model-00002-of-00002.safetensors: expected a float dtype (F32, "
                        "F16, BF16, F8_E4M3), found I32"));
  EXPECT_THAT(error_of([&] { ck->expect("lm_head.weight", DType::BF16, {4, 2}); }),
              HasSubstr("tensor 'lm_head.weight' in model-00002-of-00002.safetensors: expected dtype BF16, found I32"));
}

TEST(Checkpoint, ShapeStr) {
  EXPECT_EQ(shape_str({}), "[]");
  EXPECT_EQ(shape_str({2, 3}), "[2, 3]");
}

// Streaming loaders pread tensors: location() gives each tensor's shard and absolute byte range.
TEST(Checkpoint, LocationPointsAtTheTensorBytesInItsShard) {
  TempDir d;
  write_sharded(d);
  auto ck = Checkpoint::open(d.path());
  for (const std::string name : {"model.embed_tokens.weight", "model.layers.0.mlp.gate.weight", "lm_head.weight"}) {
    const Checkpoint::Location loc = ck->location(name);
    EXPECT_EQ(loc.path.filename().string(), ck->file_of(name));
    ASSERT_EQ(loc.bytes, ck->info(name).nbytes);
    std::ifstream in(loc.path, std::ios::binary);
    std::vector<char> got(loc.bytes);
    in.seekg(std::streamoff(loc.offset));
    in.read(got.data(), std::streamsize(got.size()));
    ASSERT_TRUE(in) << name;
    const auto want = ck->bytes(name);
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size())) << name;
  }
}
