// Test-only fault injection (`fathom serve --enable-fault-injection` and the request field
// "fathom_fault": {"site", "after_tokens"}): the engine raises an error for that one request at
// one site once it has produced `after_tokens` tokens, so tests can show that an error while
// handling one request ends that request alone and leaves the rest of its step intact.
#pragma once
#include <stdexcept>
#include <string>
#include <string_view>

namespace fathom {

enum class FaultSite { None, Sample, Detokenize, Stop, Forward };

struct FaultInjection {
  FaultSite site = FaultSite::None;
  int after_tokens = 0;
  bool fires(FaultSite at, int64_t tokens_so_far) const { return site == at && tokens_so_far >= after_tokens; }
};

inline const char* fault_site_name(FaultSite s) {
  switch (s) {
    case FaultSite::Sample: return "sample";
    case FaultSite::Detokenize: return "detokenize";
    case FaultSite::Stop: return "stop";
    case FaultSite::Forward: return "forward";
    case FaultSite::None: break;
  }
  return "none";
}

inline FaultSite fault_site_from_name(std::string_view name) {
  for (FaultSite s : {FaultSite::Sample, FaultSite::Detokenize, FaultSite::Stop, FaultSite::Forward})
    if (name == fault_site_name(s)) return s;
  return FaultSite::None;
}

// An error in the handling of one request; `stage` names where (the label of
// fathom:request_errors_total).
class RequestError : public std::runtime_error {
 public:
  RequestError(std::string stage, const std::string& what) : std::runtime_error(what), stage_(std::move(stage)) {}
  const std::string& stage() const { return stage_; }

 private:
  std::string stage_;
};

inline void maybe_inject_fault(const FaultInjection& f, FaultSite at, int64_t tokens_so_far) {
  if (f.fires(at, tokens_so_far))
    throw RequestError(fault_site_name(at), std::string("injected fault at ") + fault_site_name(at) + " (--enable-fault-injection)");
}

}  // namespace fathom
