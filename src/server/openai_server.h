// OpenAI-compatible HTTP server over the continuous-batching Engine: /v1/models,
// /v1/completions, /v1/chat/completions (SSE streaming), /health, /metrics. The HTTP side is
// event-driven (http_server.h); responses are assembled from engine events on the connection's
// strand, never on the engine thread, and a client that disconnects aborts its request.
#pragma once
#include "server/serve_options.h"

namespace fathom::server {

// Loads the model, serves until SIGINT/SIGTERM, returns the process exit code.
int run_server(const ServeOptions& options);

}  // namespace fathom::server
