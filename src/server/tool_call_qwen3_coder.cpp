// The qwen3_coder block: <function=NAME> (<parameter=P> VALUE </parameter>)* </function> then
// </tool_call>, whitespace between tags. Each value loses one leading and one trailing newline
// (the template writes them around it). The arguments are built as {"P": V, ...}: a string
// parameter streams as its text arrives, any other is converted once its value is complete.
#include <algorithm>
#include <nlohmann/json.hpp>

#include "server/stream_text.h"
#include "server/tool_arguments.h"
#include "server/tool_call_block.h"

namespace fathom::server {
namespace {

using json = nlohmann::ordered_json;
constexpr size_t kMaxNameLength = 256;
constexpr std::string_view kFunctionOpen = "<function=", kFunctionClose = "</function>";
constexpr std::string_view kParamOpen = "<parameter=", kParamClose = "</parameter>";

class Qwen3CoderBlock final : public ToolCallBlock {
 public:
  explicit Qwen3CoderBlock(const json& tools) : tools_(tools) {}

 protected:
  Status parse() override {
    for (;;) {
      switch (state_) {
        case State::kFunction:
          skip_space();
          if (Match m = match(kFunctionOpen); m != Match::kYes) return m == Match::kMaybe ? Status::kMore : fail();
          state_ = State::kFunctionName;
          break;
        case State::kFunctionName: {
          std::optional<std::string> n;
          if (Status s = read_name(n); s != Status::kDone) return s;
          name_ = std::move(n);
          state_ = State::kBetween;
          break;
        }
        case State::kBetween:
          if (Status s = between(); s != Status::kDone) return s;
          break;
        case State::kParamName:
          if (Status s = param_name(); s != Status::kDone) return s;
          break;
        case State::kValueStart:
          if (pos_ >= buf_.size()) return Status::kMore;
          if (buf_[pos_] == '\n') ++pos_;
          value_start_ = emitted_ = searched_ = pos_;
          state_ = State::kValue;
          break;
        case State::kValue:
          if (Status s = value(); s != Status::kDone) return s;
          break;
        case State::kAfterFunction:
          skip_space();
          if (Match m = match(kToolCallClose); m != Match::kYes) return m == Match::kMaybe ? Status::kMore : fail();
          return Status::kDone;
      }
    }
  }

 private:
  enum class State { kFunction, kFunctionName, kBetween, kParamName, kValueStart, kValue, kAfterFunction };

  // The text up to '>' (trimmed, one line, not empty).
  Status read_name(std::optional<std::string>& out) {
    const size_t gt = buf_.find('>', pos_);
    const size_t stop = std::min(gt, buf_.size());
    std::string_view name = std::string_view(buf_).substr(pos_, stop - pos_);
    if (name.find_first_of("<\n") != std::string_view::npos || name.size() > kMaxNameLength) return fail();
    if (gt == std::string::npos) return Status::kMore;
    pos_ = gt + 1;
    while (!name.empty() && is_space(name.front())) name.remove_prefix(1);
    while (!name.empty() && is_space(name.back())) name.remove_suffix(1);
    if (name.empty()) return fail();
    out = std::string(name);
    return Status::kDone;
  }

  // Between parameters: the next one, or the end of the function.
  Status between() {
    skip_space();
    const Match p = match(kParamOpen);
    if (p == Match::kYes) {
      state_ = State::kParamName;
      return Status::kDone;
    }
    const Match f = match(kFunctionClose);
    if (f == Match::kYes) {
      args_ += params_ == 0 ? "{}" : "}";
      state_ = State::kAfterFunction;
      return Status::kDone;
    }
    return (p == Match::kMaybe || f == Match::kMaybe) ? Status::kMore : fail();
  }

  Status param_name() {
    std::optional<std::string> p;
    if (Status s = read_name(p); s != Status::kDone) return s;
    kind_ = parameter_kind(find_parameter_schema(tools_, *name_, *p));
    args_ += params_++ == 0 ? "{" : ", ";
    args_ += dump_argument(json(*p));
    args_ += ": ";
    if (kind_ == ParamKind::kString) args_ += '"';
    state_ = State::kValueStart;
    return Status::kDone;
  }

  Status value() {
    const size_t close = buf_.find(kParamClose, searched_);
    if (close == std::string::npos) {
      searched_ = std::max(value_start_, buf_.size() - std::min(buf_.size(), kParamClose.size()));
      if (kind_ == ParamKind::kString) {  // pass on what cannot be the newline and tag that end it
        std::string_view rest = std::string_view(buf_).substr(emitted_);
        size_t hold = std::max(partial_tag_suffix(rest, "\n</parameter>"), partial_tag_suffix(rest, kParamClose));
        rest.remove_suffix(hold);
        rest.remove_suffix(incomplete_utf8_tail(rest));
        append_json_escaped(args_, rest);
        emitted_ += rest.size();
      }
      return Status::kMore;
    }
    size_t end = close;
    if (end > value_start_ && buf_[end - 1] == '\n') --end;
    if (kind_ == ParamKind::kString) {
      append_json_escaped(args_, std::string_view(buf_).substr(emitted_, end - emitted_));
      args_ += '"';
    } else {
      args_ += dump_argument(convert_parameter(std::string_view(buf_).substr(value_start_, end - value_start_), kind_));
    }
    pos_ = close + kParamClose.size();
    state_ = State::kBetween;
    return Status::kDone;
  }

  const json& tools_;
  State state_ = State::kFunction;
  int params_ = 0;
  ParamKind kind_ = ParamKind::kUnknown;
  size_t value_start_ = 0, emitted_ = 0, searched_ = 0;
};

}  // namespace

std::unique_ptr<ToolCallBlock> make_qwen3_coder_block(const json& tools) {
  return std::make_unique<Qwen3CoderBlock>(tools);
}

}  // namespace fathom::server
