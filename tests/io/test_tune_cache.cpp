// The tuning cache: an entry comes back for exactly the fields it was saved with; a changed
// driver or GPU (any field) finds nothing; a broken file is ignored and replaced.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "io/tune_cache.h"

namespace fathom {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("fathom_tune_test_" + std::to_string(::getpid()));
  ~TempDir() { fs::remove_all(path); }
};

TuneKey key() {
  return TuneKey{{{"gpu", "NVIDIA H200"}, {"cc", "9.0"}, {"driver", "580.159.04"}, {"cuda", "13.0"},
                  {"fathom", "0.1"}, {"model", "hidden 4096, 512 experts"}}};
}

TEST(TuneCache, RoundTripAndInvalidation) {
  TempDir dir;
  EXPECT_FALSE(load_tune_cache(key(), dir.path.string()));
  const nlohmann::json results = {{"moe.fp4.prefill", {{"4096", "prefill 4w/3st"}}}};
  save_tune_cache(key(), results, dir.path.string());
  auto got = load_tune_cache(key(), dir.path.string());
  ASSERT_TRUE(got);
  EXPECT_EQ(*got, results);
  for (const char* field : {"gpu", "driver", "cuda", "fathom", "model"}) {
    TuneKey k = key();
    k.fields[field] += " (changed)";
    EXPECT_NE(k.file_name(), key().file_name()) << field;
    EXPECT_FALSE(load_tune_cache(k, dir.path.string())) << field;
  }
  std::ofstream(dir.path / key().file_name()) << "{ not json";
  EXPECT_FALSE(load_tune_cache(key(), dir.path.string()));
  save_tune_cache(key(), results, dir.path.string());
  EXPECT_TRUE(load_tune_cache(key(), dir.path.string()));
}

TEST(TuneCache, LivesUnderXdgCacheHome) {
  const char* old = std::getenv("XDG_CACHE_HOME");
  const std::string saved = old ? old : "";
  ::setenv("XDG_CACHE_HOME", "/tmp/xdg-test", 1);
  EXPECT_EQ(tune_cache_dir(), "/tmp/xdg-test/fathom");
  if (old) ::setenv("XDG_CACHE_HOME", saved.c_str(), 1);
  else ::unsetenv("XDG_CACHE_HOME");
}

}  // namespace
}  // namespace fathom
