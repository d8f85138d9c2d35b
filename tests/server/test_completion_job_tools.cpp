// CompletionJob with --tool-call-parser: engine text events carrying tool calls become OpenAI
// message.tool_calls (whole response) and delta.tool_calls chunks (streaming), with finish_reason
// "tool_calls"; the streamed pieces assemble to the whole response's calls and content.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "server/completion_job.h"

namespace fathom::server {
namespace {

using json = nlohmann::ordered_json;

const json kTools = json::parse(R"([{"type": "function", "function": {"name": "get_weather", "parameters":
    {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}])");

const std::string kCoderOutput =
    "Let me look.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n"
    "<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>";

ParsedRequest chat_request(bool stream, json tools = kTools) {
  ParsedRequest r;
  r.chat = true;
  r.common.stream = stream;
  r.common.n = 1;
  r.common.params.logprobs = -1;
  r.prompts = {{1, 2, 3}};
  r.tools = std::move(tools);
  return r;
}

// Feeds `text` to the job in pieces of `piece` bytes, the last event finishing with `reason`.
std::vector<std::string> feed(CompletionJob& job, const std::string& text, size_t piece, const std::string& reason) {
  std::vector<std::string> chunks;
  for (size_t at = 0; at < text.size(); at += piece) {
    RequestOutput ev;
    ev.text = text.substr(at, piece);
    ev.completion_tokens = int(at / piece) + 1;
    ev.finished = at + piece >= text.size();
    if (ev.finished) ev.finish_reason = reason;
    chunks.push_back(job.apply(ev));
  }
  return chunks;
}

json data_of(const std::string& sse) {
  EXPECT_EQ(sse.rfind("data: ", 0), 0u) << sse;
  return json::parse(sse.substr(6));
}

TEST(CompletionJobTools, WholeResponseCarriesToolCalls) {
  CompletionJob job(chat_request(false), "chatcmpl-1", "m", false, nullptr, ToolCallFormat::kQwen3Coder,
                    seeded_tool_call_ids(7));
  feed(job, kCoderOutput, 1000, "stop");
  ASSERT_TRUE(job.done());
  const json r = job.response();
  const json& ch = r["choices"][0];
  EXPECT_EQ(ch["finish_reason"], "tool_calls");
  EXPECT_EQ(ch["message"]["content"], "Let me look.");
  const json& calls = ch["message"]["tool_calls"];
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0]["type"], "function");
  EXPECT_EQ(calls[0]["id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(calls[0]["function"]["arguments"].get<std::string>()), json::parse(R"({"city": "Paris", "days": 3})"));
  EXPECT_EQ(json::parse(calls[1]["function"]["arguments"].get<std::string>()), json::parse(R"({"city": "Oslo"})"));
  EXPECT_NE(calls[0]["id"], calls[1]["id"]);
}

TEST(CompletionJobTools, NoCallsKeepsContentAndFinishReason) {
  CompletionJob job(chat_request(false), "chatcmpl-2", "m", false, nullptr, ToolCallFormat::kHermes);
  feed(job, "Just text, no <tool_call.", 4, "length");
  const json r = job.response();
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r["choices"][0]["message"]["content"], "Just text, no <tool_call.");
  EXPECT_TRUE(r["choices"][0]["message"]["tool_calls"].empty());
}

TEST(CompletionJobTools, WithoutToolsInTheRequestNothingIsParsed) {
  CompletionJob job(chat_request(false, nullptr), "chatcmpl-3", "m", false, nullptr, ToolCallFormat::kQwen3Coder);
  feed(job, kCoderOutput, 1000, "stop");
  const json r = job.response();
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(r["choices"][0]["message"]["content"], kCoderOutput);
  EXPECT_FALSE(r["choices"][0]["message"].contains("tool_calls"));
}

TEST(CompletionJobTools, StreamedChunksAssembleToTheWholeResponse) {
  for (size_t piece : {1, 2, 3, 7, 16, 1000}) {
    CompletionJob job(chat_request(true), "chatcmpl-4", "m", false, nullptr, ToolCallFormat::kQwen3Coder,
                      seeded_tool_call_ids(7));
    std::string content;
    std::vector<json> calls;
    std::string finish;
    for (const std::string& chunk : feed(job, kCoderOutput, piece, "stop")) {
      if (chunk.empty()) continue;
      const json d = data_of(chunk)["choices"][0];
      const json& delta = d["delta"];
      if (delta.contains("content")) content += delta["content"].get<std::string>();
      if (delta.contains("tool_calls"))
        for (const json& t : delta["tool_calls"]) {
          const size_t i = t["index"].get<size_t>();
          if (t.contains("id")) {
            ASSERT_EQ(i, calls.size()) << "piece " << piece;
            EXPECT_EQ(t["type"], "function");
            calls.push_back({{"id", t["id"]}, {"name", t["function"]["name"]}, {"arguments", ""}});
          }
          ASSERT_LT(i, calls.size());
          calls[i]["arguments"] = calls[i]["arguments"].get<std::string>() + t["function"]["arguments"].get<std::string>();
        }
      if (!d["finish_reason"].is_null()) finish = d["finish_reason"];
    }
    EXPECT_EQ(finish, "tool_calls") << "piece " << piece;
    EXPECT_EQ(content, "Let me look.") << "piece " << piece;
    ASSERT_EQ(calls.size(), 2u) << "piece " << piece;
    EXPECT_EQ(calls[0]["name"], "get_weather");
    EXPECT_EQ(json::parse(calls[0]["arguments"].get<std::string>()), json::parse(R"({"city": "Paris", "days": 3})"));
    EXPECT_EQ(json::parse(calls[1]["arguments"].get<std::string>()), json::parse(R"({"city": "Oslo"})"));
  }
}

// tool_choice "required" cut by max_tokens: the complete calls come back as tool_calls, the cut
// one is dropped, and finish_reason stays "length" (whole response and stream alike).
TEST(CompletionJobTools, RequiredCallsCutByLengthKeepTheCompleteOnes) {
  // A tool_choice "required" job fed `text` and ended by max_tokens (its chunks when streaming).
  auto cut_required = [](const std::string& text, bool stream, std::vector<std::string>& chunks) {
    ParsedRequest req = chat_request(stream);
    req.tool_choice = ParsedRequest::ToolChoice::Required;
    auto job = std::make_unique<CompletionJob>(req, "chatcmpl-1", "m", false, nullptr, std::nullopt,
                                               seeded_tool_call_ids(7));
    chunks = feed(*job, text, 16, "length");
    return job;
  };
  const std::string cut = R"([{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "get_weather", "parameters": {"ci)";
  for (bool stream : {false, true}) {
    std::vector<std::string> chunks;
    const auto job = cut_required(cut, stream, chunks);
    ASSERT_TRUE(job->done());
    json calls, finish;
    if (!stream) {
      const json ch = job->response()["choices"][0];
      calls = ch["message"]["tool_calls"];
      finish = ch["finish_reason"];
      EXPECT_TRUE(ch["message"]["content"].is_null());
    } else {
      const json last = data_of(chunks.back())["choices"][0];
      calls = last["delta"]["tool_calls"];
      finish = last["finish_reason"];
    }
    ASSERT_EQ(calls.size(), 1u) << stream;
    EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
    EXPECT_EQ(json::parse(calls[0]["function"]["arguments"].get<std::string>()), json::parse(R"({"city": "Paris"})"));
    EXPECT_EQ(finish, "length");
  }
  // Cut inside the first call: no calls and no content (not the partial list as text).
  const std::string first = R"([{"name": "get_weather", "parameters": {"ci)";
  for (bool stream : {false, true}) {
    std::vector<std::string> chunks;
    const auto job = cut_required(first, stream, chunks);
    ASSERT_TRUE(job->done());
    if (!stream) {
      const json ch = job->response()["choices"][0];
      EXPECT_TRUE(ch["message"]["content"].is_null()) << ch.dump();
      EXPECT_TRUE(ch["message"]["tool_calls"].empty()) << ch.dump();
      EXPECT_EQ(ch["finish_reason"], "length");
    } else {
      json finish;
      for (const std::string& chunk : chunks)
        for (size_t at = 0; (at = chunk.find("data: {", at)) != std::string::npos; ++at) {
          const json d = json::parse(chunk.substr(at + 6, chunk.find("\n\n", at) - at - 6))["choices"];
          if (d.empty()) continue;
          EXPECT_FALSE(d[0]["delta"].contains("content") && !d[0]["delta"]["content"].is_null()) << chunk;
          EXPECT_FALSE(d[0]["delta"].contains("tool_calls")) << chunk;
          finish = d[0]["finish_reason"];
        }
      EXPECT_EQ(finish, "length");
    }
  }
}

}  // namespace
}  // namespace fathom::server
