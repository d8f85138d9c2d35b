// The server's version, as GET /version answers it (vLLM's {"version": ...}).
#pragma once

namespace fathom::server {

inline constexpr const char* kFathomVersion = "0.1.0";

}  // namespace fathom::server
