// Child-process isolation: results come back, and a crash, an exception, an early exit or a hang
// in the child ends only the child.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <thread>

#include "core/isolated_run.h"

namespace fathom {
namespace {

TEST(IsolatedRun, ReturnsTheChildsOutput) {
  const IsolatedResult r = run_isolated([] { return std::string("pid ") + std::to_string(::getpid()); }, 10);
  ASSERT_TRUE(r.ok()) << r.describe();
  EXPECT_NE(r.output, "pid " + std::to_string(::getpid()));  // it ran elsewhere
  EXPECT_EQ(r.output.rfind("pid ", 0), 0u);
}

TEST(IsolatedRun, LargeOutputsArriveWhole) {
  const IsolatedResult r = run_isolated([] { return std::string(1 << 20, 'x'); }, 10);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.output.size(), size_t(1) << 20);
}

TEST(IsolatedRun, AnExceptionIsAFailureWithItsMessage) {
  const IsolatedResult r = run_isolated([]() -> std::string { throw std::runtime_error("bad kernel"); }, 10);
  EXPECT_EQ(r.status, IsolatedResult::Status::Failed);
  EXPECT_EQ(r.output, "bad kernel");
}

TEST(IsolatedRun, CrashesAreReportedAndTheParentGoesOn) {
  IsolatedResult r = run_isolated([]() -> std::string { std::abort(); }, 10);
  EXPECT_EQ(r.status, IsolatedResult::Status::Crashed);
  EXPECT_EQ(r.signal, SIGABRT);
  EXPECT_NE(r.describe().find("signal 6"), std::string::npos) << r.describe();
  r = run_isolated([]() -> std::string {
    ::raise(SIGSEGV);
    return "unreachable";
  }, 10);
  EXPECT_EQ(r.status, IsolatedResult::Status::Crashed);
  EXPECT_EQ(r.signal, SIGSEGV);
  r = run_isolated([]() -> std::string { ::_exit(3); }, 10);  // as CUDA's fatal-error paths may
  EXPECT_EQ(r.status, IsolatedResult::Status::Crashed);
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_TRUE(run_isolated([] { return std::string("still here"); }, 10).ok());
}

TEST(IsolatedRun, AHangIsKilledAtTheTimeout) {
  const auto t0 = std::chrono::steady_clock::now();
  const IsolatedResult r = run_isolated([] {
    std::this_thread::sleep_for(std::chrono::seconds(60));
    return std::string("late");
  }, 0.5);
  EXPECT_EQ(r.status, IsolatedResult::Status::TimedOut);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
}

}  // namespace
}  // namespace fathom
