// Runs a function in a child process, so that what it breaks cannot take the caller down: a
// kernel that faults (illegal address, launch failure) poisons its CUDA context for good, and a
// backend being verified may do exactly that. The child is a fork: call this before the caller
// has initialised CUDA (a forked child cannot use its parent's context), and let the child do
// its own GPU work from scratch.
#pragma once
#include <functional>
#include <string>

namespace fathom {

struct IsolatedResult {
  enum class Status { Ok, Failed, Crashed, TimedOut };
  Status status = Status::Failed;
  std::string output;  // what the function returned (Ok), or the exception's message (Failed)
  int signal = 0;      // Crashed: the signal that ended the child
  int exit_code = 0;   // Crashed without a signal: the child's exit status
  bool ok() const { return status == Status::Ok; }
  // One line for logs: "ok", "failed: ...", "crashed: signal 11 (Segmentation fault)", ...
  std::string describe() const;
};

// `fn` runs in the child; its return value (any bytes) comes back in `output`. An exception in
// the child is Failed with its message; a signal or an exit before returning is Crashed; still
// running after `timeout_s` seconds, the child is killed and the result is TimedOut.
IsolatedResult run_isolated(const std::function<std::string()>& fn, double timeout_s);

}  // namespace fathom
