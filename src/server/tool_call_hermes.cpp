// The hermes block: {"name": NAME, "arguments": {...}} then </tool_call>. The arguments are
// passed on as the model wrote them (checked to be a JSON object), so they stream byte for byte
// as they arrive; the call is announced when its arguments object opens with the name known.
// "parameters" is taken for "arguments" (some fine-tunes write it); other keys are skipped.
#include <algorithm>
#include <nlohmann/json.hpp>

#include "server/stream_text.h"
#include "server/tool_call_block.h"

namespace fathom::server {
namespace {

using json = nlohmann::ordered_json;
constexpr int kMaxDepth = 64;

// Finds where a JSON value that starts at `start` ends, across feeds.
struct ValueScan {
  size_t start = 0, pos = 0;
  int depth = 0;
  bool in_str = false, esc = false;

  void reset(size_t at) { *this = ValueScan{at, at}; }
  // 1: the value ended at pos; 0: more text needed; -1: not a value.
  int scan(std::string_view buf) {
    const char first = buf[start];
    const bool scalar = first != '"' && first != '{' && first != '[';
    while (pos < buf.size()) {
      const char c = buf[pos];
      if (scalar) {
        if (is_space(c) || c == ',' || c == '}' || c == ']') return 1;
        ++pos;
        continue;
      }
      ++pos;
      if (in_str) {
        if (esc) esc = false;
        else if (c == '\\') esc = true;
        else if (c == '"' && (in_str = false, depth == 0)) return 1;
      } else if (c == '"') {
        in_str = true;
      } else if (c == '{' || c == '[') {
        if (++depth > kMaxDepth) return -1;
      } else if (c == '}' || c == ']') {
        if (--depth == 0) return 1;
        if (depth < 0) return -1;
      }
    }
    return 0;
  }
};

class HermesBlock final : public ToolCallBlock {
 protected:
  Status parse() override {
    for (;;) {
      switch (state_) {
        case State::kOpen:
          skip_space();
          if (pos_ >= buf_.size()) return Status::kMore;
          if (buf_[pos_++] != '{') return fail();
          state_ = State::kFirstKey;
          break;
        case State::kFirstKey:
          skip_space();
          if (pos_ >= buf_.size()) return Status::kMore;
          if (buf_[pos_] == '}') {
            ++pos_;
            state_ = State::kClose;
          } else {
            state_ = State::kKey;
          }
          break;
        case State::kKey:
        case State::kValue:
          if (Status s = parse_value(); s != Status::kDone) return s;
          break;
        case State::kColon:
          skip_space();
          if (pos_ >= buf_.size()) return Status::kMore;
          if (buf_[pos_++] != ':') return fail();
          state_ = State::kValue;
          value_started_ = false;
          break;
        case State::kAfterValue:
          skip_space();
          if (pos_ >= buf_.size()) return Status::kMore;
          if (buf_[pos_] != ',' && buf_[pos_] != '}') return fail();
          state_ = buf_[pos_++] == ',' ? State::kKey : State::kClose;
          value_started_ = false;
          break;
        case State::kClose:
          return close();
      }
    }
  }

 private:
  enum class State { kOpen, kFirstKey, kKey, kColon, kValue, kAfterValue, kClose };

  bool is_args_key() const { return key_ == "arguments" || key_ == "parameters"; }

  // A key (kKey) or a member's value (kValue); kDone when it is complete.
  Status parse_value() {
    if (!value_started_) {
      skip_space();
      if (pos_ >= buf_.size()) return Status::kMore;
      if (state_ == State::kKey && buf_[pos_] != '"') return fail();
      if (state_ == State::kValue && is_args_key()) {
        if (have_args_ || buf_[pos_] != '{') return fail();
        if (found_name_) name_ = found_name_;  // the call is on: announce it and stream
      }
      scan_.reset(pos_);
      streamed_ = pos_;
      value_started_ = true;
    }
    const int r = scan_.scan(buf_);
    if (r < 0) return fail();
    const bool streaming = state_ == State::kValue && is_args_key() && name_;
    if (streaming) {  // pass on what is scanned, but never half a UTF-8 character before the end
      size_t upto = scan_.pos;
      if (r == 0) upto -= incomplete_utf8_tail(std::string_view(buf_).substr(scan_.start, upto - scan_.start));
      if (upto > streamed_) args_.append(buf_, streamed_, upto - streamed_);
      streamed_ = std::max(streamed_, upto);
    }
    if (r == 0) return Status::kMore;
    pos_ = scan_.pos;
    const std::string_view raw = std::string_view(buf_).substr(scan_.start, scan_.pos - scan_.start);
    if (!json::accept(raw.begin(), raw.end())) return fail();
    return take_value(raw);
  }

  Status take_value(std::string_view raw) {
    if (state_ == State::kKey) {
      key_ = json::parse(raw.begin(), raw.end()).get<std::string>();
      state_ = State::kColon;
      return Status::kDone;
    }
    if (key_ == "name") {
      json v = json::parse(raw.begin(), raw.end());
      if (!v.is_string() || found_name_) return fail();
      found_name_ = v.get<std::string>();
    } else if (is_args_key()) {
      have_args_ = true;
      if (!name_) held_args_ = raw;  // arguments before the name: sent when the name comes
    }
    state_ = State::kAfterValue;
    return Status::kDone;
  }

  Status close() {
    skip_space();
    switch (match(kToolCallClose)) {
      case Match::kMaybe: return Status::kMore;
      case Match::kNo: return fail();
      case Match::kYes: break;
    }
    if (!found_name_ || found_name_->empty()) return fail();
    if (!name_) {
      name_ = found_name_;
      args_ += have_args_ ? held_args_ : std::string("{}");
    }
    return Status::kDone;
  }

  State state_ = State::kOpen;
  bool value_started_ = false;
  ValueScan scan_;
  std::string key_;
  std::optional<std::string> found_name_;
  bool have_args_ = false;
  std::string held_args_;
  size_t streamed_ = 0;  // end in buf_ of the argument text passed on
};

}  // namespace

std::unique_ptr<ToolCallBlock> make_hermes_block() { return std::make_unique<HermesBlock>(); }

}  // namespace fathom::server
