// How much host memory this process may still take, for defaults sized from it (the prefix
// cache's host tier): the kernel's MemAvailable, bounded by the memory limit of the process's
// control group where one is set, since inside a container MemAvailable is the whole machine's
// and pinning past the container's limit gets the process killed.
#pragma once
#include <cstdint>
#include <string>

namespace fathom {

// Bytes (0: unknown). Reads /proc/meminfo and the cgroup's memory.max, memory.current and
// memory.stat (v2) or memory.limit_in_bytes, memory.usage_in_bytes and memory.stat (v1).
int64_t available_host_memory();

// The rule, from the files' texts: MemAvailable (kB) of `meminfo`, and with a limit (a number of
// bytes; "max", empty or absurdly large: none) at most the limit less `usage` (bytes), of which
// the inactive file cache `stat` lists (inactive_file, or v1's total_inactive_file) does not
// count: the kernel reclaims it first (as `docker stats` counts a container's memory).
int64_t available_host_memory(const std::string& meminfo, const std::string& limit, const std::string& usage,
                              const std::string& stat);

}  // namespace fathom
