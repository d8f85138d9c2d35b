#include "server/http_server.h"

#include <sys/resource.h>
#include <sys/socket.h>

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <deque>
#include <list>
#include <mutex>
#include <thread>

#include "core/error.h"

namespace fathom::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

std::string HttpRequest::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (k == name) return v;
  return {};
}

std::string percent_decode(std::string_view s) {
  auto hex = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1; };
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && hex(s[i + 1]) >= 0 && hex(s[i + 2]) >= 0) {
      out += char(hex(s[i + 1]) * 16 + hex(s[i + 2]));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

namespace {

std::chrono::steady_clock::duration seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
  return out;
}

// A client still sends bytes after the first pipelined request, or it has closed: which one.
enum class Peek { Data, Closed, Nothing };
Peek peek_socket(int fd) {
  char c;
  const ssize_t n = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n > 0) return Peek::Data;
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return Peek::Nothing;
  return Peek::Closed;
}

}  // namespace

class Session;

struct HttpServer::Impl {
  HttpServerOptions opt;
  struct Route {
    std::string method, path;
    HttpHandler handler;
    bool on_io_thread;
  };
  std::vector<Route> routes;
  std::function<std::optional<HttpResponse>(const HttpRequest&)> pre_routing;
  std::atomic<int> open{0};
  std::atomic<bool> stopped{false};
  std::mutex idle_mu;
  std::list<std::weak_ptr<Session>> idle;  // oldest first

  // Declared after what sessions touch in their destructors: destroyed first.
  net::io_context ioc;
  tcp::acceptor acceptor{ioc};
  net::steady_timer accept_retry{ioc};
  std::unique_ptr<net::thread_pool> workers;

  explicit Impl(HttpServerOptions o) : opt(std::move(o)), ioc(std::max(1, opt.io_threads)) {}

  std::string error_body(int status, const std::string& msg) const {
    return opt.error_body ? opt.error_body(status, msg) : msg;
  }
  void do_accept();
  void on_accept(beast::error_code ec, tcp::socket socket);
  bool evict_one_idle();
  void reject_busy(tcp::socket socket);
};

// One connection: reads requests one at a time, dispatches them, writes their responses.
// Everything runs on the connection's strand (the stream's executor).
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, HttpServer::Impl& server) : stream_(std::move(socket)), srv_(server) {}
  ~Session() {
    if (!closed_) srv_.open.fetch_sub(1);
  }

  void start() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->wait_for_request(); });
  }
  template <class Fn>
  void on_strand(Fn&& fn) {
    net::post(stream_.get_executor(), std::forward<Fn>(fn));
  }

  // Called by the idle list's owner (under idle_mu) when evicting: the session is no longer idle.
  bool in_idle = false;
  std::list<std::weak_ptr<Session>>::iterator idle_it;

  // Exchange operations, on the strand; `id` guards against calls for an earlier request.
  void respond(uint64_t id, HttpResponse r);
  void begin_stream(uint64_t id, int status, const std::string& content_type, const HttpHeaders& headers);
  void write_chunk(uint64_t id, std::string data);
  void end_stream(uint64_t id);
  void set_gone(uint64_t id, std::function<void()> fn) {
    if (id == request_id_ && !response_done_ && !closed_) gone_fn_ = std::move(fn);
    else if (id == request_id_ && closed_ && !response_done_) fn();  // already gone
  }
  void close();

 private:
  struct Out {
    enum Kind { Full, Head, Chunk, Last } kind;
    std::shared_ptr<http::response<http::string_body>> full;
    std::shared_ptr<http::response<http::empty_body>> head;
    std::shared_ptr<http::response_serializer<http::empty_body>> serializer;
    std::string data;
  };

  void wait_for_request();
  void read_request();
  void on_header(beast::error_code ec);
  void read_body();
  void on_read_error(beast::error_code ec);
  void dispatch_request();
  void watch_client();
  void on_readable(beast::error_code ec, uint64_t id);
  void pump();
  void on_write(beast::error_code ec);
  void finish_response();
  void enter_idle();
  void leave_idle();
  void log(int status) const {
    if (srv_.opt.log_requests) std::fprintf(stderr, "%s %s -> %d\n", method_.c_str(), path_.c_str(), status);
  }
  // An error the server itself answers (malformed or oversized request); closes afterwards.
  void reply_error_and_close(int status, const std::string& message);

  beast::tcp_stream stream_;
  HttpServer::Impl& srv_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  bool closed_ = false;
  bool keep_alive_ = true;
  unsigned version_ = 11;
  uint64_t request_id_ = 0;
  bool response_done_ = true;  // no request in flight
  bool streaming_ = false, chunked_ = false, last_queued_ = false;
  bool watching_ = false, writing_ = false;
  size_t queued_bytes_ = 0;
  std::function<void()> gone_fn_;
  std::deque<Out> out_;
  std::string method_, path_;
};

class Exchange : public HttpExchange {
 public:
  Exchange(std::shared_ptr<Session> s, uint64_t id) : s_(std::move(s)), id_(id) {}
  void respond(HttpResponse r) override {
    s_->on_strand([s = s_, id = id_, r = std::move(r)]() mutable { s->respond(id, std::move(r)); });
  }
  void begin_stream(int status, std::string content_type, HttpHeaders headers) override {
    s_->on_strand([s = s_, id = id_, status, ct = std::move(content_type), h = std::move(headers)] {
      s->begin_stream(id, status, ct, h);
    });
  }
  void write(std::string chunk) override {
    s_->on_strand([s = s_, id = id_, c = std::move(chunk)]() mutable { s->write_chunk(id, std::move(c)); });
  }
  void end_stream() override {
    s_->on_strand([s = s_, id = id_] { s->end_stream(id); });
  }
  void post(std::function<void()> fn) override { s_->on_strand(std::move(fn)); }
  void on_client_gone(std::function<void()> fn) override {
    s_->on_strand([s = s_, id = id_, fn = std::move(fn)]() mutable { s->set_gone(id, std::move(fn)); });
  }

 private:
  std::shared_ptr<Session> s_;
  uint64_t id_;
};

void Session::enter_idle() {
  std::lock_guard<std::mutex> l(srv_.idle_mu);
  srv_.idle.push_back(weak_from_this());
  idle_it = std::prev(srv_.idle.end());
  in_idle = true;
}

void Session::leave_idle() {
  std::lock_guard<std::mutex> l(srv_.idle_mu);
  if (!in_idle) return;
  srv_.idle.erase(idle_it);
  in_idle = false;
}

void Session::close() {
  if (closed_) return;
  closed_ = true;
  leave_idle();
  beast::error_code ec;
  stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
  stream_.socket().close(ec);
  // The write in flight (if any) still reads its buffers until its handler runs.
  out_.erase(writing_ && !out_.empty() ? out_.begin() + 1 : out_.begin(), out_.end());
  srv_.open.fetch_sub(1);
  if (!response_done_ && gone_fn_) {
    auto fn = std::move(gone_fn_);
    gone_fn_ = nullptr;
    fn();
  }
}

void Session::wait_for_request() {
  if (closed_) return;
  if (srv_.stopped) return close();
  if (buffer_.size() > 0) return read_request();  // a pipelined request is already here
  enter_idle();
  stream_.expires_after(seconds(srv_.opt.idle_timeout_s));
  stream_.async_read_some(buffer_.prepare(4096), [self = shared_from_this()](beast::error_code ec, size_t n) {
    self->leave_idle();
    if (ec) return self->close();
    self->buffer_.commit(n);
    self->read_request();
  });
}

void Session::read_request() {
  if (closed_) return;
  parser_.emplace();
  parser_->header_limit(uint32_t(srv_.opt.max_header_bytes));
  parser_->body_limit(srv_.opt.max_body_bytes);
  // One deadline for the whole request: headers, "100 Continue" and body.
  stream_.expires_after(seconds(srv_.opt.request_timeout_s));
  http::async_read_header(stream_, buffer_, *parser_,
                          [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
}

void Session::on_header(beast::error_code ec) {
  if (ec) return on_read_error(ec);
  if (parser_->is_done()) return dispatch_request();
  auto& h = parser_->get();
  if (beast::iequals(h[http::field::expect], "100-continue")) {
    static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
    net::async_write(stream_, net::buffer(kContinue), [self = shared_from_this()](beast::error_code e, size_t) {
      if (e) return self->close();
      self->read_body();
    });
    return;
  }
  read_body();
}

void Session::read_body() {
  http::async_read(stream_, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, size_t) {
    if (ec) return self->on_read_error(ec);
    self->dispatch_request();
  });
}

void Session::on_read_error(beast::error_code ec) {
  if (closed_) return;
  if (ec == http::error::end_of_stream || ec == beast::error::timeout || ec == net::error::operation_aborted ||
      ec == net::error::connection_reset || ec == net::error::eof)
    return close();
  if (ec == http::error::body_limit)
    return reply_error_and_close(413, "Request body too large (limit " + std::to_string(srv_.opt.max_body_bytes) + " bytes)");
  if (ec == http::error::header_limit)
    return reply_error_and_close(431, "Request headers too large (limit " + std::to_string(srv_.opt.max_header_bytes) + " bytes)");
  reply_error_and_close(400, "Malformed HTTP request: " + ec.message());
}

void Session::reply_error_and_close(int status, const std::string& message) {
  ++request_id_;
  response_done_ = false;
  keep_alive_ = false;
  HttpResponse r;
  r.status = status;
  r.body = srv_.error_body(status, message);
  respond(request_id_, std::move(r));
}

void Session::dispatch_request() {
  http::request<http::string_body> msg = parser_->release();
  parser_.reset();
  stream_.expires_never();  // the handler may take its time; writes set their own deadlines
  HttpRequest req;
  req.method = std::string(msg.method_string());
  const std::string_view target(msg.target().data(), msg.target().size());
  const size_t q = target.find('?');
  req.path = std::string(target.substr(0, q));
  if (q != std::string_view::npos) req.query = std::string(target.substr(q + 1));
  for (const auto& f : msg)
    req.headers.emplace_back(lower(std::string_view(f.name_string().data(), f.name_string().size())), std::string(f.value()));
  req.body = std::move(msg.body());
  keep_alive_ = msg.keep_alive();
  version_ = msg.version();
  method_ = req.method;
  path_ = req.path;
  ++request_id_;
  response_done_ = false;
  gone_fn_ = nullptr;
  watch_client();

  auto ex = std::make_shared<Exchange>(shared_from_this(), request_id_);
  if (srv_.pre_routing)
    if (auto r = srv_.pre_routing(req)) return respond(request_id_, std::move(*r));
  const HttpServer::Impl::Route* route = nullptr;
  bool path_known = false;
  // A path ending in '*' matches every path it prefixes (GET /v1/models/{id}).
  auto matches = [&](const std::string& p) {
    if (!p.empty() && p.back() == '*') return req.path.size() >= p.size() && req.path.compare(0, p.size() - 1, p, 0, p.size() - 1) == 0;
    return p == req.path;
  };
  for (const auto& rt : srv_.routes)
    if (matches(rt.path)) {
      path_known = true;
      if (rt.method == req.method) route = &rt;
    }
  if (!route) {
    HttpResponse r;
    r.status = path_known ? 405 : 404;
    r.body = srv_.error_body(r.status, path_known ? "Method not allowed: " + req.method + " " + req.path
                                                   : "Not found: " + req.method + " " + req.path);
    return respond(request_id_, std::move(r));
  }
  auto run = [handler = route->handler, ex, this_srv = &srv_](const HttpRequest& rq) {
    try {
      handler(rq, ex);
    } catch (const std::exception& e) {
      ex->respond(HttpResponse{500, "application/json", this_srv->error_body(500, std::string("internal error: ") + e.what()), {}});
    }
  };
  if (route->on_io_thread) return run(req);
  net::post(*srv_.workers, [run, req = std::move(req)] { run(req); });
}

// While a response is pending, the socket becomes readable when the client closes it (EOF):
// that is how a vanished client is noticed without waiting for a write to fail.
void Session::watch_client() {
  if (closed_ || response_done_ || buffer_.size() > 0) return;  // pipelined bytes: cannot tell
  watching_ = true;
  stream_.socket().async_wait(tcp::socket::wait_read, [self = shared_from_this(), id = request_id_](beast::error_code ec) {
    self->on_readable(ec, id);
  });
}

void Session::on_readable(beast::error_code ec, uint64_t id) {
  if (closed_ || id != request_id_ || response_done_) return;
  watching_ = false;
  if (ec == net::error::operation_aborted) return;
  if (!ec) {
    const Peek p = peek_socket(stream_.socket().native_handle());
    if (p == Peek::Data) return;  // the next request, pipelined: stop watching
    if (p == Peek::Nothing) return watch_client();
  }
  close();  // runs the gone callback
}

void Session::respond(uint64_t id, HttpResponse r) {
  if (closed_ || id != request_id_ || response_done_ || streaming_ || last_queued_) return;
  auto res = std::make_shared<http::response<http::string_body>>(http::status(r.status), version_);
  res->set(http::field::server, "fathom");
  res->set(http::field::content_type, r.content_type);
  for (const auto& [k, v] : r.headers) res->set(k, v);
  res->keep_alive(keep_alive_ && !srv_.stopped);
  res->body() = std::move(r.body);
  res->prepare_payload();
  log(r.status);
  last_queued_ = true;
  out_.push_back(Out{Out::Full, std::move(res), nullptr, nullptr, {}});
  pump();
}

void Session::begin_stream(uint64_t id, int status, const std::string& content_type, const HttpHeaders& headers) {
  if (closed_ || id != request_id_ || response_done_ || streaming_ || last_queued_) return;
  streaming_ = true;
  chunked_ = version_ >= 11;
  if (!chunked_) keep_alive_ = false;  // HTTP/1.0: the end of the body is the end of the connection
  auto head = std::make_shared<http::response<http::empty_body>>(http::status(status), version_);
  head->set(http::field::server, "fathom");
  head->set(http::field::content_type, content_type);
  for (const auto& [k, v] : headers) head->set(k, v);
  head->keep_alive(keep_alive_ && !srv_.stopped);
  if (chunked_) head->chunked(true);
  log(status);
  out_.push_back(Out{Out::Head, nullptr, std::move(head), nullptr, {}});
  pump();
}

void Session::write_chunk(uint64_t id, std::string data) {
  if (closed_ || id != request_id_ || !streaming_ || last_queued_ || data.empty()) return;
  // A client that stops reading must not make the server buffer without bound.
  constexpr size_t kMaxQueued = size_t(64) << 20;
  queued_bytes_ += data.size();
  if (queued_bytes_ > kMaxQueued) return close();
  out_.push_back(Out{Out::Chunk, nullptr, nullptr, nullptr, std::move(data)});
  pump();
}

void Session::end_stream(uint64_t id) {
  if (closed_ || id != request_id_ || !streaming_ || last_queued_) return;
  last_queued_ = true;
  out_.push_back(Out{Out::Last, nullptr, nullptr, nullptr, {}});
  pump();
}

void Session::pump() {
  if (writing_ || out_.empty() || closed_) return;
  writing_ = true;
  Out& o = out_.front();
  stream_.expires_after(seconds(srv_.opt.write_timeout_s));
  auto done = [self = shared_from_this()](beast::error_code ec, size_t) { self->on_write(ec); };
  switch (o.kind) {
    case Out::Full: http::async_write(stream_, *o.full, done); break;
    case Out::Head:
      o.serializer = std::make_shared<http::response_serializer<http::empty_body>>(*o.head);
      http::async_write_header(stream_, *o.serializer, done);
      break;
    case Out::Chunk:
      if (chunked_) net::async_write(stream_, http::make_chunk(net::buffer(o.data)), done);
      else net::async_write(stream_, net::buffer(o.data), done);
      break;
    case Out::Last:
      if (chunked_) net::async_write(stream_, http::make_chunk_last(), done);
      else net::post(stream_.get_executor(), [done] { done({}, 0); });
      break;
  }
}

void Session::on_write(beast::error_code ec) {
  writing_ = false;
  if (closed_) return out_.clear();
  if (ec) return close();
  // A deadline left running would fail the next write at once if it expired in between (a
  // stream may wait long for its next token).
  stream_.expires_never();
  const Out::Kind kind = out_.front().kind;
  if (kind == Out::Chunk) queued_bytes_ -= out_.front().data.size();
  out_.pop_front();
  if (kind == Out::Full || kind == Out::Last) return finish_response();
  pump();
}

void Session::finish_response() {
  response_done_ = true;
  streaming_ = chunked_ = last_queued_ = false;
  queued_bytes_ = 0;
  gone_fn_ = nullptr;
  if (watching_) {
    beast::error_code ec;
    stream_.socket().cancel(ec);
    watching_ = false;
  }
  if (!keep_alive_ || srv_.stopped) return close();
  wait_for_request();
}

bool HttpServer::Impl::evict_one_idle() {
  std::shared_ptr<Session> victim;
  {
    std::lock_guard<std::mutex> l(idle_mu);
    while (!idle.empty() && !victim) {
      victim = idle.front().lock();
      if (victim) victim->in_idle = false;
      idle.pop_front();
    }
  }
  if (!victim) return false;
  victim->on_strand([victim] { victim->close(); });
  return true;
}

void HttpServer::Impl::reject_busy(tcp::socket socket) {
  struct Busy {
    tcp::socket socket;
    std::string text;
  };
  auto b = std::make_shared<Busy>(Busy{std::move(socket), {}});
  const std::string body = error_body(503, "Too many connections (--max-connections " + std::to_string(opt.max_connections) +
                                               "); retry later");
  b->text = "HTTP/1.1 503 Service Unavailable\r\nServer: fathom\r\nRetry-After: 1\r\nContent-Type: application/json\r\n"
            "Connection: close\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  net::async_write(b->socket, net::buffer(b->text), [b](beast::error_code, size_t) {
    beast::error_code ec;
    b->socket.shutdown(tcp::socket::shutdown_both, ec);
    b->socket.close(ec);
  });
}

void HttpServer::Impl::do_accept() {
  if (stopped) return;
  acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket s) { on_accept(ec, std::move(s)); });
}

void HttpServer::Impl::on_accept(beast::error_code ec, tcp::socket socket) {
  if (stopped) return;
  if (ec) {
    // Out of file descriptors: free an idle connection and try again shortly, not in a busy loop.
    if (ec == net::error::no_descriptors || ec == net::error::no_buffer_space) {
      evict_one_idle();
      accept_retry.expires_after(std::chrono::milliseconds(20));
      accept_retry.async_wait([this](beast::error_code) { do_accept(); });
      return;
    }
    return do_accept();
  }
  const int n = open.fetch_add(1) + 1;
  const int max = opt.max_connections;
  const int soft = max - std::max(1, max / 32);  // near the limit: close the oldest idle ones first
  const bool evicted = n > soft && evict_one_idle();
  if (n > max && !evicted) {
    open.fetch_sub(1);
    reject_busy(std::move(socket));
  } else {
    beast::error_code e;
    socket.set_option(tcp::no_delay(true), e);
    std::make_shared<Session>(std::move(socket), *this)->start();
  }
  do_accept();
}

HttpServer::HttpServer(HttpServerOptions options) : impl_(std::make_shared<Impl>(std::move(options))) {}

HttpServer::~HttpServer() {
  stop();
  impl_->workers.reset();  // joins; pending handlers see closed exchanges
}

void HttpServer::route(const std::string& method, const std::string& path, HttpHandler handler, bool on_io_thread) {
  impl_->routes.push_back({method, path, std::move(handler), on_io_thread});
}

void HttpServer::set_pre_routing(std::function<std::optional<HttpResponse>(const HttpRequest&)> fn) {
  impl_->pre_routing = std::move(fn);
}

void HttpServer::bind() {
  Impl& s = *impl_;
  // Every connection is a file descriptor: raise the soft limit to the hard one, and keep the
  // connection bound below it (room for model files, the engine and logs).
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
    if (rl.rlim_cur < rl.rlim_max) {
      rl.rlim_cur = rl.rlim_max;
      setrlimit(RLIMIT_NOFILE, &rl);
      getrlimit(RLIMIT_NOFILE, &rl);
    }
    const rlim_t room = rl.rlim_cur > 256 ? rl.rlim_cur - 128 : rl.rlim_cur / 2;
    if (rl.rlim_cur != RLIM_INFINITY && rlim_t(s.opt.max_connections) > room) {
      std::fprintf(stderr, "fathom serve: --max-connections %d lowered to %llu (open-file limit %llu)\n", s.opt.max_connections,
                   (unsigned long long)room, (unsigned long long)rl.rlim_cur);
      s.opt.max_connections = int(room);
    }
  }
  FATHOM_CHECK(s.opt.max_connections > 0, "--max-connections must be positive");
  beast::error_code ec;
  const auto addr = net::ip::make_address(s.opt.host, ec);
  FATHOM_CHECK(!ec, "cannot listen on ", s.opt.host, ": not an IP address (", ec.message(), ")");
  const tcp::endpoint ep(addr, uint16_t(s.opt.port));
  s.acceptor.open(ep.protocol(), ec);
  if (!ec) s.acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) s.acceptor.bind(ep, ec);
  if (!ec) s.acceptor.listen(s.opt.backlog, ec);
  FATHOM_CHECK(!ec, "cannot listen on ", s.opt.host, ":", s.opt.port, ": ", ec.message());
  const int workers = s.opt.worker_threads > 0 ? s.opt.worker_threads : std::max(2, int(std::thread::hardware_concurrency()));
  s.workers = std::make_unique<net::thread_pool>(size_t(workers));
}

int HttpServer::port() const { return impl_->acceptor.local_endpoint().port(); }
int HttpServer::max_connections() const { return impl_->opt.max_connections; }
int HttpServer::open_connections() const { return impl_->open.load(); }

void HttpServer::run() {
  Impl& s = *impl_;
  s.do_accept();
  std::vector<std::thread> extra;
  for (int i = 1; i < s.opt.io_threads; ++i) extra.emplace_back([&s] { s.ioc.run(); });
  s.ioc.run();
  for (auto& t : extra) t.join();
}

void HttpServer::stop() {
  Impl& s = *impl_;
  if (s.stopped.exchange(true)) return;
  net::post(s.ioc, [&s] {
    beast::error_code ec;
    s.acceptor.close(ec);
    s.accept_retry.cancel();
    s.ioc.stop();
  });
}

}  // namespace fathom::server
