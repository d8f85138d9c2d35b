#include "io/tune_cache.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace fathom {

std::string TuneKey::file_name() const {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over "name=value\n" lines (sorted by the map)
  for (const auto& [k, v] : fields)
    for (char c : k + "=" + v + "\n") {
      h ^= uint8_t(c);
      h *= 1099511628211ull;
    }
  char buf[40];
  std::snprintf(buf, sizeof buf, "tune-%016llx.json", (unsigned long long)h);
  return buf;
}

std::string tune_cache_dir() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/fathom";
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : ".") + "/.cache/fathom";
}

std::optional<nlohmann::json> load_tune_cache(const TuneKey& key, const std::string& dir) {
  std::ifstream in(std::filesystem::path(dir) / key.file_name());
  if (!in) return std::nullopt;
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("key") || !j.contains("results")) return std::nullopt;
  if (j["key"] != nlohmann::json(key.fields)) return std::nullopt;  // a hash collision, or edited
  return j["results"];
}

void save_tune_cache(const TuneKey& key, const nlohmann::json& results, const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  FATHOM_CHECK(!ec, "tune cache: cannot create ", dir, ": ", ec.message());
  const fs::path final_path = fs::path(dir) / key.file_name();
  const fs::path tmp = final_path.string() + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(tmp);
    FATHOM_CHECK(bool(out), "tune cache: cannot write ", tmp.string());
    out << nlohmann::json{{"key", key.fields}, {"results", results}}.dump(1) << "\n";
    FATHOM_CHECK(bool(out), "tune cache: cannot write ", tmp.string());
  }
  fs::rename(tmp, final_path, ec);
  FATHOM_CHECK(!ec, "tune cache: cannot rename into ", final_path.string(), ": ", ec.message());
}

}  // namespace fathom
