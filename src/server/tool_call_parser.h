// Tool calls in a model's output, as vLLM's --tool-call-parser qwen3_coder and hermes find them:
//   qwen3_coder (Qwen3.5, Qwen3-Coder): <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n
//                                      </function>\n</tool_call>, values typed by the tool's schema;
//   hermes (Qwen3):                    <tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call>.
// One state machine serves both the streaming parser and parse_tool_calls (which feeds it the
// whole text), so streaming in any split gives the same content and calls.
//
// Content is the text outside the calls: the whitespace next to a call is dropped and the pieces
// left between calls are joined by a blank line. A block that does not parse (unclosed, bad JSON,
// unknown structure) stays in the content as it was written. Streaming cannot take back a call
// whose name it has sent: a block that breaks after that ends the call there (its arguments as
// sent) and its remaining text up to </tool_call> is dropped.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fathom::server {

enum class ToolCallFormat { kQwen3Coder, kHermes };

// vLLM's parser names "qwen3_coder" and "hermes"; nullopt for anything else.
std::optional<ToolCallFormat> tool_call_format_from_name(std::string_view name);

struct ToolCall {
  std::string id;         // "call_" + 24 alphanumerics
  std::string name;
  std::string arguments;  // a JSON object
};

struct ToolCallParse {
  std::string content;    // empty: no content
  std::vector<ToolCall> calls;
};

// Makes tool-call ids.
using ToolCallIdGenerator = std::function<std::string()>;
ToolCallIdGenerator random_tool_call_ids();               // seeded from std::random_device
ToolCallIdGenerator seeded_tool_call_ids(uint64_t seed);  // the same ids for the same seed (tests)

// Parses a complete output. `tools` is the request's OpenAI `tools` list (schemas give the
// qwen3_coder parameter types; null or empty: types unknown). Never throws on any text.
ToolCallParse parse_tool_calls(std::string_view text, ToolCallFormat format, const nlohmann::ordered_json& tools,
                               ToolCallIdGenerator ids = random_tool_call_ids());

// One call's part of a streamed chunk (OpenAI's delta.tool_calls[i]): the first delta of a call
// carries its id and name, the following ones only pieces of `arguments`.
struct ToolCallDelta {
  int index = 0;
  std::string id;         // empty after the first delta
  std::string name;       // empty after the first delta
  std::string arguments;  // the next piece of the arguments' JSON text (may be empty)
};

struct ToolCallStreamDelta {
  std::string content;
  std::vector<ToolCallDelta> tool_calls;  // in order; one entry per call touched
  bool empty() const { return content.empty() && tool_calls.empty(); }
};

class ToolCallStreamParser {
 public:
  ToolCallStreamParser(ToolCallFormat format, nlohmann::ordered_json tools,
                       ToolCallIdGenerator ids = random_tool_call_ids());
  ~ToolCallStreamParser();
  ToolCallStreamParser(ToolCallStreamParser&&) noexcept;
  ToolCallStreamParser& operator=(ToolCallStreamParser&&) noexcept;

  // Feeds the next piece of output (any split, even inside a tag or a UTF-8 character); returns
  // what became certain. Text that may still turn out to be a tag, whitespace next to a possible
  // call, and an unfinished UTF-8 character are held back.
  ToolCallStreamDelta feed(std::string_view text);
  // End of output: releases what was held back (an unfinished block becomes content).
  ToolCallStreamDelta finish();

  // Calls whose name was sent so far (finish_reason "tool_calls" when > 0).
  int calls() const;

 private:
  friend ToolCallParse parse_tool_calls(std::string_view, ToolCallFormat, const nlohmann::ordered_json&,
                                        ToolCallIdGenerator);
  struct Impl;
  ToolCallStreamParser(ToolCallFormat format, nlohmann::ordered_json tools, ToolCallIdGenerator ids, bool whole);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fathom::server
