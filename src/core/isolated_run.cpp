#include "core/isolated_run.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>

#include "core/error.h"

namespace fathom {

namespace {

// The child's message: one status byte ('o' returned, 'e' threw) and the text.
void write_all(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += size_t(n);
  }
}

}  // namespace

std::string IsolatedResult::describe() const {
  switch (status) {
    case Status::Ok:
      return "ok";
    case Status::Failed:
      return "failed: " + output;
    case Status::Crashed:
      return signal ? "crashed: signal " + std::to_string(signal) + " (" + strsignal(signal) + ")"
                    : "crashed: exited with status " + std::to_string(exit_code) + " before returning";
    case Status::TimedOut:
      return "timed out";
  }
  return "?";
}

IsolatedResult run_isolated(const std::function<std::string()>& fn, double timeout_s) {
  int fds[2];
  FATHOM_CHECK(::pipe(fds) == 0, "run_isolated: pipe: ", std::strerror(errno));
  std::fflush(nullptr);  // the child must not flush the parent's buffered output a second time
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    fail("run_isolated: fork: ", std::strerror(errno));
  }
  if (pid == 0) {
    ::close(fds[0]);
    std::string msg;
    try {
      msg = "o" + fn();
    } catch (const std::exception& e) {
      msg = std::string("e") + e.what();
    } catch (...) {
      msg = "eunknown exception";
    }
    write_all(fds[1], msg);
    ::close(fds[1]);
    ::_exit(0);  // no atexit handlers or static destructors of the parent's state
  }
  ::close(fds[1]);
  std::string msg;
  bool timed_out = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  char buf[4096];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    const int r = ::poll(&p, 1, int(std::min<int64_t>(left.count(), 1000)));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the child closed its end: finished or died
    msg.append(buf, size_t(n));
  }
  ::close(fds[0]);
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  IsolatedResult res;
  if (timed_out) {
    res.status = IsolatedResult::Status::TimedOut;
  } else if (WIFSIGNALED(status)) {
    res.status = IsolatedResult::Status::Crashed;
    res.signal = WTERMSIG(status);
  } else if (msg.empty() || (WIFEXITED(status) && WEXITSTATUS(status) != 0)) {
    res.status = IsolatedResult::Status::Crashed;
    res.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  } else {
    res.status = msg[0] == 'o' ? IsolatedResult::Status::Ok : IsolatedResult::Status::Failed;
    res.output = msg.substr(1);
  }
  return res;
}

}  // namespace fathom
