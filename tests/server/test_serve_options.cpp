// --prefix-cache-host-gb resolved for a runner (issue 37): none by default on the CPU engine (its
// snapshots are host memory already), the size asked for where the runner can move snapshots,
// nothing with prefix caching off, and a clear error for what is not a size or is more than the
// host has available.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "golden_reader.h"
#include "model/cpu_runner.h"
#include "server/serve_options.h"

namespace fathom::server {
namespace {

TEST(ServeOptions, PrefixCacheHostTierSize) {
  const std::filesystem::path dir = testing::fixtures_dir() / "qwen3_dense";
  ASSERT_TRUE(std::filesystem::exists(dir / "config.json")) << dir << " missing";
  const auto runner = CpuRunner::open(dir, false);
  ServeOptions o;
  EXPECT_EQ(prefix_cache_host_bytes(o, *runner), 0);  // the default here: none
  o.prefix_cache_host_gb = 1.5;
  EXPECT_EQ(prefix_cache_host_bytes(o, *runner), int64_t(3) << 29);
  o.engine.enable_prefix_caching = false;
  EXPECT_EQ(prefix_cache_host_bytes(o, *runner), 0);
  o.engine.enable_prefix_caching = true;
  // 1e9: not a size; 1e6 GB (a petabyte): a size no host has available.
  for (double bad : {std::nan(""), 1e9, double(INFINITY), 1e6}) {
    o.prefix_cache_host_gb = bad;
    try {
      prefix_cache_host_bytes(o, *runner);
      ADD_FAILURE() << bad << " accepted";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("--prefix-cache-host-gb"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace fathom::server
