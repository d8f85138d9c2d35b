// Event-driven HTTP/1.1 server (Boost.Beast over Asio). A few IO threads serve every
// connection, so an idle or slow client costs a socket and a little memory, never a thread:
//  - connections are bounded (--max-connections); near the bound the oldest idle keep-alive
//    connections are closed first, past it a new connection gets 503 with Retry-After;
//  - deadlines: a connection may wait `idle_timeout` for the first byte of a request, then must
//    deliver the whole request (headers and body) within `request_timeout` (slowloris);
//  - a client that goes away while its response is pending is noticed at once (the socket
//    becomes readable at EOF), and the exchange's on_client_gone callback runs, so that the
//    work for it can be aborted.
// Handlers run on a worker pool (parsing, tokenizing) or, for cheap routes such as /health and
// /metrics, on the IO thread itself so that they answer however busy the workers are.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fathom::server {

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  std::string method, path, query, body;
  HttpHeaders headers;  // names in lower case
  std::string header(std::string_view lower_case_name) const;
};

// A path segment's %XX escapes decoded ("%2Fa" -> "/a"); a malformed escape stays as it is.
std::string percent_decode(std::string_view s);

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  HttpHeaders headers;
};

// The reply side of one request. Every call may come from any thread: it is queued onto the
// connection's strand and runs there in call order. Calls after the client has gone are no-ops.
class HttpExchange {
 public:
  virtual ~HttpExchange() = default;
  virtual void respond(HttpResponse response) = 0;
  // A chunked response: begin_stream, any number of write, then end_stream.
  virtual void begin_stream(int status, std::string content_type, HttpHeaders headers) = 0;
  virtual void write(std::string chunk) = 0;
  virtual void end_stream() = 0;
  // Runs `fn` on the connection's strand, after everything queued before it.
  virtual void post(std::function<void()> fn) = 0;
  // `fn` runs once, on the strand, when the client disconnects before the response is complete.
  virtual void on_client_gone(std::function<void()> fn) = 0;
};

using HttpHandler = std::function<void(const HttpRequest&, std::shared_ptr<HttpExchange>)>;

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;
  int max_connections = 4096;
  double idle_timeout_s = 5;       // waiting for the first byte of a (next) request
  double request_timeout_s = 30;   // reading one request's headers and body
  double write_timeout_s = 60;     // one write to a client that does not read
  size_t max_header_bytes = 64 << 10;
  size_t max_body_bytes = size_t(64) << 20;
  int io_threads = 2;
  int worker_threads = 0;          // 0: the number of cores (at least 2)
  int backlog = 4096;
  bool log_requests = false;
  // The JSON error body for statuses the server produces itself (400, 404, 405, 413, 503, ...).
  std::function<std::string(int status, const std::string& message)> error_body;
};

class HttpServer {
 public:
  explicit HttpServer(HttpServerOptions options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // `path` ending in '*' matches any non-empty rest after it (GET /v1/models/*).
  // `on_io_thread`: the handler is quick and runs on the IO thread (health checks, metrics).
  void route(const std::string& method, const std::string& path, HttpHandler handler, bool on_io_thread = false);
  // Runs before routing; a response it returns is sent instead (authentication).
  void set_pre_routing(std::function<std::optional<HttpResponse>(const HttpRequest&)> fn);

  // Binds and listens (throws fathom::Error naming the address); raises the open-file limit to
  // fit max_connections, or lowers max_connections to fit it.
  void bind();
  int port() const;
  int max_connections() const;
  // Serves until stop() (from any thread, also a signal watcher).
  void run();
  void stop();
  int open_connections() const;

  struct Impl;  // the connections (http_server.cpp) share it

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace fathom::server
