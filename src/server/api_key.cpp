#include "server/api_key.h"

#include <cstdint>

namespace fathom::server {

bool constant_time_equal(std::string_view a, std::string_view b) {
  // Every byte of the longer string is visited whatever the contents; only the lengths leak.
  const size_t n = a.size() > b.size() ? a.size() : b.size();
  volatile uint8_t diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const uint8_t x = i < a.size() ? uint8_t(a[i]) : 0, y = i < b.size() ? uint8_t(b[i]) : 0;
    diff = diff | uint8_t(x ^ y);
  }
  return diff == 0;
}

bool is_anthropic_path(std::string_view path) {
  return path == "/v1/messages" || path == "/v1/messages/count_tokens";
}

bool request_has_api_key(const HttpRequest& req, std::string_view key) {
  constexpr std::string_view bearer = "Bearer ";
  const std::string auth = req.header("authorization");
  bool ok = auth.size() >= bearer.size() && auth.compare(0, bearer.size(), bearer) == 0 &&
            constant_time_equal(std::string_view(auth).substr(bearer.size()), key);
  if (is_anthropic_path(req.path)) ok = constant_time_equal(req.header("x-api-key"), key) || ok;
  return ok;
}

}  // namespace fathom::server
