// The host memory a default may size itself from: MemAvailable, bounded by a cgroup's limit.
#include "core/host_memory.h"

#include <gtest/gtest.h>

namespace fathom {
namespace {

const char* kMeminfo =
    "MemTotal:       131072000 kB\nMemFree:         1000000 kB\nMemAvailable:   100000000 kB\nBuffers: 12 kB\n";

TEST(HostMemory, MemAvailableWithoutALimit) {
  const int64_t available = int64_t(100000000) << 10;
  EXPECT_EQ(available_host_memory(kMeminfo, "", "", ""), available);
  EXPECT_EQ(available_host_memory(kMeminfo, "max\n", "123\n", ""), available);                     // v2, none
  EXPECT_EQ(available_host_memory(kMeminfo, "9223372036854771712\n", "5000\n", ""), available);  // v1, none
  EXPECT_EQ(available_host_memory(kMeminfo, "garbage", "1", ""), available);
}

TEST(HostMemory, AContainersLimitBoundsIt) {
  const int64_t gb = int64_t(1) << 30;
  const std::string limit = std::to_string(32 * gb) + "\n";
  // 32 GB limit, 20 GB used: 12 GB left, far below the machine's MemAvailable.
  EXPECT_EQ(available_host_memory(kMeminfo, limit, std::to_string(20 * gb) + "\n", ""), 12 * gb);
  // Of 30 GB used, 6 GB is inactive file cache (v2's and v1's names): 8 GB left.
  const std::string v2_stat = "anon 100\nfile 200\ninactive_file " + std::to_string(6 * gb) + "\nactive_file 7\n";
  const std::string v1_stat = "cache 5\ntotal_inactive_file " + std::to_string(6 * gb) + "\n";
  EXPECT_EQ(available_host_memory(kMeminfo, limit, std::to_string(30 * gb), v2_stat), 8 * gb);
  EXPECT_EQ(available_host_memory(kMeminfo, limit, std::to_string(30 * gb), v1_stat), 8 * gb);
  // Used past the limit: nothing.
  EXPECT_EQ(available_host_memory(kMeminfo, std::to_string(8 * gb), std::to_string(9 * gb), ""), 0);
  // A limit above what the machine has: MemAvailable.
  EXPECT_EQ(available_host_memory(kMeminfo, std::to_string(4096 * gb), "0", ""), int64_t(100000000) << 10);
  // No meminfo: the limit's room alone.
  EXPECT_EQ(available_host_memory("", std::to_string(2 * gb), std::to_string(gb), ""), gb);
}

}  // namespace
}  // namespace fathom
