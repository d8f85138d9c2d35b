// Error type used across Fathom. Every user-facing failure is a fathom::Error whose
// message is one line naming the file/tensor/field and the problem.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace fathom {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <class... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  throw Error(os.str());
}

}  // namespace fathom

// Checks a condition that depends on input (files, configs, requests); throws fathom::Error.
#define FATHOM_CHECK(cond, ...)                  \
  do {                                           \
    if (!(cond)) ::fathom::fail(__VA_ARGS__);    \
  } while (0)
