// --api-key: which headers may carry the key, and a comparison whose time does not depend on
// where the first differing byte is (a plain == lets a client find the key byte by byte).
#pragma once
#include <string>
#include <string_view>

#include "server/http_server.h"

namespace fathom::server {

// True when a and b are equal; the time depends on their lengths only.
bool constant_time_equal(std::string_view a, std::string_view b);

// Whether `req` carries `key`: "Authorization: Bearer <key>" on every route, and Anthropic's
// "x-api-key: <key>" as well on /v1/messages (the Anthropic SDK sends only that header).
bool request_has_api_key(const HttpRequest& req, std::string_view key);

// /v1/messages and /v1/messages/count_tokens: answered in Anthropic's shapes.
bool is_anthropic_path(std::string_view path);

}  // namespace fathom::server
