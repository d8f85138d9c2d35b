#include "server/tool_call_parser.h"

#include <random>

#include "server/stream_text.h"
#include "server/tool_call_block.h"

namespace fathom::server {

using json = nlohmann::ordered_json;

std::optional<ToolCallFormat> tool_call_format_from_name(std::string_view name) {
  if (name == "qwen3_coder") return ToolCallFormat::kQwen3Coder;
  if (name == "hermes") return ToolCallFormat::kHermes;
  return std::nullopt;
}

namespace {

std::string make_id(std::mt19937_64& engine) {
  static constexpr std::string_view kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kAlphabet[engine() % kAlphabet.size()];
  return id;
}

ToolCallIdGenerator ids_from(uint64_t seed) {
  auto engine = std::make_shared<std::mt19937_64>(seed);
  return [engine] { return make_id(*engine); };
}

// Content with the whitespace next to calls dropped: trailing whitespace is held until what
// follows is known (dropped before a call), leading whitespace after a call is dropped, and text
// after a call is set off from earlier text by a blank line. An unfinished UTF-8 character is
// held too.
class ContentEmitter {
 public:
  void push(std::string_view text, std::string& out, bool final = false) {
    std::string joined = held_;
    joined += text;
    held_.clear();
    std::string_view v = joined;
    if (after_call_)
      while (!v.empty() && is_space(v.front())) v.remove_prefix(1);
    if (!final) {
      size_t k = incomplete_utf8_tail(v);
      if (k == 0)
        while (k < v.size() && is_space(v[v.size() - 1 - k])) ++k;
      held_ = v.substr(v.size() - k);
      v.remove_suffix(k);
    }
    if (v.empty()) return;
    if (after_call_) {
      if (emitted_) out += "\n\n";
      after_call_ = false;
    }
    out += v;
    emitted_ = true;
  }
  void flush(std::string& out) { push("", out, true); }
  // A call follows: held whitespace goes; anything else held (a broken character) stays.
  void before_call(std::string& out) {
    for (char c : held_)
      if (!is_space(c)) return flush(out);
    held_.clear();
  }
  void after_call() { after_call_ = true; }

 private:
  std::string held_;
  bool after_call_ = false, emitted_ = false;
};

}  // namespace

ToolCallIdGenerator random_tool_call_ids() {
  std::random_device rd;
  return ids_from((uint64_t(rd()) << 32) ^ rd());
}

ToolCallIdGenerator seeded_tool_call_ids(uint64_t seed) { return ids_from(seed); }

struct ToolCallStreamParser::Impl {
  // kContent: looking for "<tool_call>"; kBlock: inside one; kBroken: a block that did not parse,
  // passed on as content up to its "</tool_call>"; kSkip: the rest of a block that broke after
  // its call was announced.
  enum class Mode { kContent, kBlock, kBroken, kSkip };

  ToolCallFormat format;
  json tools;
  ToolCallIdGenerator ids;
  bool whole;  // parse_tool_calls: a call is announced only once its block is complete
  Mode mode = Mode::kContent;
  std::string pending;
  std::unique_ptr<ToolCallBlock> block;
  bool announced = false;
  int calls = 0;
  ContentEmitter content;

  void run(ToolCallStreamDelta& out);
  void start_block(std::string_view rest, ToolCallStreamDelta& out);
  void feed_block(std::string_view text, ToolCallStreamDelta& out);
  void announce(ToolCallStreamDelta& out);
  void add_arguments(ToolCallStreamDelta& out);
  void finish(ToolCallStreamDelta& out);
};

void ToolCallStreamParser::Impl::run(ToolCallStreamDelta& out) {
  for (;;) {
    if (mode == Mode::kBlock) return;
    const std::string_view tag = mode == Mode::kContent ? kToolCallOpen : kToolCallClose;
    const size_t at = pending.find(tag);
    if (at == std::string::npos) {  // hold back what may be the start of the tag
      const size_t keep = partial_tag_suffix(pending, tag);
      if (mode != Mode::kSkip) content.push(std::string_view(pending).substr(0, pending.size() - keep), out.content);
      pending.erase(0, pending.size() - keep);
      return;
    }
    if (mode == Mode::kContent) {
      content.push(std::string_view(pending).substr(0, at), out.content);
      std::string rest = pending.substr(at + tag.size());
      pending.clear();
      start_block(rest, out);
      continue;
    }
    if (mode == Mode::kBroken) content.push(std::string_view(pending).substr(0, at + tag.size()), out.content);
    pending.erase(0, at + tag.size());
    mode = Mode::kContent;
  }
}

void ToolCallStreamParser::Impl::start_block(std::string_view rest, ToolCallStreamDelta& out) {
  block = format == ToolCallFormat::kHermes ? make_hermes_block() : make_qwen3_coder_block(tools);
  announced = false;
  mode = Mode::kBlock;
  feed_block(rest, out);
}

void ToolCallStreamParser::Impl::feed_block(std::string_view text, ToolCallStreamDelta& out) {
  const ToolCallBlock::Status s = block->feed(text);
  if (!whole && !announced && block->name()) announce(out);
  if (announced) add_arguments(out);
  if (s == ToolCallBlock::Status::kMore) return;
  if (s == ToolCallBlock::Status::kDone) {
    if (!announced) announce(out);
    add_arguments(out);
    pending = block->text().substr(block->end());
    mode = Mode::kContent;
    content.after_call();
  } else if (announced) {  // too late to take the call back: it ends here
    pending = block->text();
    mode = Mode::kSkip;
    content.after_call();
  } else {  // not a call: its text is content
    pending = std::string(kToolCallOpen) + block->text();
    mode = Mode::kBroken;
  }
  block.reset();
}

void ToolCallStreamParser::Impl::announce(ToolCallStreamDelta& out) {
  content.before_call(out.content);
  out.tool_calls.push_back({calls++, ids(), *block->name(), ""});
  announced = true;
}

void ToolCallStreamParser::Impl::add_arguments(ToolCallStreamDelta& out) {
  std::string piece = block->take_arguments();
  if (piece.empty()) return;
  if (!out.tool_calls.empty() && out.tool_calls.back().index == calls - 1) out.tool_calls.back().arguments += piece;
  else out.tool_calls.push_back({calls - 1, "", "", std::move(piece)});
}

void ToolCallStreamParser::Impl::finish(ToolCallStreamDelta& out) {
  if (mode == Mode::kBlock) {  // unclosed
    if (announced && !whole) {
      mode = Mode::kSkip;
    } else {
      pending = std::string(kToolCallOpen) + block->text();
      mode = Mode::kBroken;
    }
    block.reset();
  }
  if (mode != Mode::kSkip) content.push(pending, out.content, true);
  pending.clear();
  content.flush(out.content);
  mode = Mode::kContent;
}

ToolCallStreamParser::ToolCallStreamParser(ToolCallFormat format, json tools, ToolCallIdGenerator ids)
    : ToolCallStreamParser(format, std::move(tools), std::move(ids), false) {}

ToolCallStreamParser::ToolCallStreamParser(ToolCallFormat format, json tools, ToolCallIdGenerator ids, bool whole)
    : impl_(std::make_unique<Impl>()) {
  impl_->format = format;
  impl_->tools = std::move(tools);
  impl_->ids = ids ? std::move(ids) : random_tool_call_ids();
  impl_->whole = whole;
}

ToolCallStreamParser::~ToolCallStreamParser() = default;
ToolCallStreamParser::ToolCallStreamParser(ToolCallStreamParser&&) noexcept = default;
ToolCallStreamParser& ToolCallStreamParser::operator=(ToolCallStreamParser&&) noexcept = default;

ToolCallStreamDelta ToolCallStreamParser::feed(std::string_view text) {
  ToolCallStreamDelta out;
  if (impl_->mode == Impl::Mode::kBlock) impl_->feed_block(text, out);
  else impl_->pending.append(text);
  impl_->run(out);
  return out;
}

ToolCallStreamDelta ToolCallStreamParser::finish() {
  ToolCallStreamDelta out;
  impl_->finish(out);
  return out;
}

int ToolCallStreamParser::calls() const { return impl_->calls; }

ToolCallParse parse_tool_calls(std::string_view text, ToolCallFormat format, const json& tools,
                               ToolCallIdGenerator ids) {
  ToolCallStreamParser parser(format, tools, std::move(ids), /*whole=*/true);
  ToolCallParse result;
  for (ToolCallStreamDelta d : {parser.feed(text), parser.finish()}) {
    result.content += d.content;
    for (ToolCallDelta& c : d.tool_calls) {
      if (!c.id.empty()) result.calls.push_back({std::move(c.id), std::move(c.name), ""});
      result.calls.back().arguments += c.arguments;
    }
  }
  return result;
}

}  // namespace fathom::server
