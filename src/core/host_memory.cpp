#include "core/host_memory.h"

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <sstream>

namespace fathom {

namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A whole non-negative number at the start of `text` (trailing whitespace allowed); -1 if not.
int64_t parse_bytes(const std::string& text) {
  size_t i = 0;
  int64_t v = 0;
  for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) {
    if (v > (INT64_MAX - 9) / 10) return -1;  // past any real limit ("unlimited" in v1 is near 2^63)
    v = v * 10 + (text[i] - '0');
  }
  if (i == 0) return -1;
  for (; i < text.size(); ++i)
    if (text[i] != '\n' && text[i] != ' ') return -1;
  return v;
}

// The process's cgroup v2 directory (from /proc/self/cgroup's "0::/path" line).
std::string cgroup_v2_dir() {
  std::istringstream lines(read_file("/proc/self/cgroup"));
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("0::", 0) == 0) return "/sys/fs/cgroup" + (line.size() > 3 && line != "0::/" ? line.substr(3) : "");
  return "/sys/fs/cgroup";
}

// The number after `key` in a "key value" listing (-1: absent).
int64_t field(const std::string& text, const std::string& key) {
  std::istringstream in(text);
  std::string k, rest;
  int64_t v = -1;
  while (in >> k >> v) {
    if (k == key) return v;
    std::getline(in, rest);
  }
  return -1;
}

}  // namespace

int64_t available_host_memory(const std::string& meminfo, const std::string& limit, const std::string& usage,
                              const std::string& stat) {
  const int64_t kb = field(meminfo, "MemAvailable:"), available = kb > 0 ? kb << 10 : 0;
  const int64_t inactive = std::max(field(stat, "inactive_file"), field(stat, "total_inactive_file"));
  const int64_t lim = parse_bytes(limit), used = parse_bytes(usage) - std::max<int64_t>(0, inactive);
  constexpr int64_t kNoLimit = int64_t(1) << 60;  // v1 writes "no limit" as about 2^63 rounded to pages
  if (lim < 0 || lim >= kNoLimit) return available;
  const int64_t room = std::max<int64_t>(0, lim - std::max<int64_t>(0, used));
  return available > 0 ? std::min(available, room) : room;
}

int64_t available_host_memory() {
  const std::string meminfo = read_file("/proc/meminfo");
  const std::string v2 = cgroup_v2_dir();
  std::string limit = read_file(v2 + "/memory.max"), usage = read_file(v2 + "/memory.current"),
              stat = read_file(v2 + "/memory.stat");
  if (limit.empty()) {  // cgroup v1
    limit = read_file("/sys/fs/cgroup/memory/memory.limit_in_bytes");
    usage = read_file("/sys/fs/cgroup/memory/memory.usage_in_bytes");
    stat = read_file("/sys/fs/cgroup/memory/memory.stat");
  }
  return available_host_memory(meminfo, limit, usage, stat);
}

}  // namespace fathom
