// The request path before the engine (server/request_parser.h): the JSON nesting limit, fields
// accepted / ignored / refused by name, logit_bias, echo and suffix (fill-in-the-middle), tool
// choice and tool-call arguments as the template sees them, and the test-only fault field.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "chat/chat_template.h"
#include "golden_reader.h"
#include "server/request_parser.h"
#include "tokenizer/tokenizer.h"

namespace fathom::server {
namespace {

using json = nlohmann::ordered_json;

// The tiny fixture model's tokenizer and template (Qwen3's), or another tokenizer folder.
struct Ctx {
  std::unique_ptr<tok::Tokenizer> tok;
  std::unique_ptr<chat::ChatTemplate> tmpl;
  RequestContext rc;
  explicit Ctx(const std::string& dir) {
    tok = std::make_unique<tok::Tokenizer>(tok::Tokenizer::from_dir(dir));
    auto src = chat::load_chat_template(dir);
    tmpl = std::make_unique<chat::ChatTemplate>(src.source);
    rc.tokenizer = tok.get();
    rc.chat_template = tmpl.get();
    rc.special_tokens = src.special_tokens;
    rc.model_names = {"m"};
    rc.vocab_size = int64_t(tok->vocab_size());
    rc.max_model_len = 4096;
  }
};

Ctx& tiny() {
  static Ctx c((testing::fixtures_dir() / "qwen35_moe").string());
  return c;
}

ApiError error_of(const std::string& body, bool chat, const RequestContext& rc = tiny().rc) {
  try {
    parse_request(body, chat, rc);
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "accepted: " << body.substr(0, 200);
  return {};
}

std::string nested(int levels) { return std::string(size_t(levels), '[') + std::string(size_t(levels), ']'); }

TEST(RequestParser, NestingLimitIsEnforcedWhileParsing) {
  // The body object is level 1: a value inside it may nest 63 more levels.
  EXPECT_NO_THROW(parse_json_limited("{\"x\": " + nested(kMaxJsonDepth - 1) + "}"));
  const ApiError e = error_of("{\"messages\": " + nested(100000) + "}", true);
  EXPECT_EQ(e.status, 400);
  EXPECT_NE(e.message.find("64 levels"), std::string::npos) << e.message;
  EXPECT_EQ(error_of("{\"x\": " + nested(kMaxJsonDepth) + "}", false).status, 400);
  EXPECT_NE(error_of("{\"prompt\": \"\xff\"}", false).message.find("not valid JSON"), std::string::npos);
}

TEST(RequestParser, UnknownFieldsAreNamedAndIgnoredOnesAccepted) {
  const ApiError e = error_of(R"({"prompt": "hi", "frobnicate": 1, "guided_whitespace_pattern": " "})", false);
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, "frobnicate");
  EXPECT_NE(e.message.find("'frobnicate', 'guided_whitespace_pattern'"), std::string::npos) << e.message;
  EXPECT_EQ(error_of(R"({"prompt": "hi", "prompt_logprobs": 2})", false).param, "prompt_logprobs");
  EXPECT_EQ(error_of(R"({"prompt": "hi", "best_of": 2})", false).param, "best_of");
  EXPECT_EQ(error_of(R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"})", true).param,
            "tool_choice");
  EXPECT_EQ(error_of(R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema"}})", true)
                .param,
            "response_format");
  EXPECT_EQ(error_of(R"({"prompt": "hi", "fathom_fault": {"site": "sample"}})", false).param, "fathom_fault");
  for (const auto& f : ignored_fields())
    EXPECT_NO_THROW(parse_request(R"({"prompt": "hi", ")" + f + R"(": "x"})", false, tiny().rc)) << f;
  EXPECT_NO_THROW(parse_request(R"({"prompt": "hi", "best_of": 1, "n": 1})", false, tiny().rc));
}

TEST(RequestParser, LogitBias) {
  const ParsedRequest r = parse_request(R"({"prompt": [1, 2], "logit_bias": {"5": -100, "7": 2.5}})", false, tiny().rc);
  const auto& bias = r.common.params.sampling.logit_bias;
  ASSERT_EQ(bias.size(), 2u);
  EXPECT_EQ(bias[0], std::make_pair(int32_t(5), -100.f));
  EXPECT_EQ(bias[1], std::make_pair(int32_t(7), 2.5f));
  EXPECT_EQ(error_of(R"({"prompt": [1], "logit_bias": {"512": 1}})", false).param, "logit_bias");
  EXPECT_EQ(error_of(R"({"prompt": [1], "logit_bias": {"-1": 1}})", false).param, "logit_bias");
  EXPECT_EQ(error_of(R"({"prompt": [1], "logit_bias": {"1": 100.5}})", false).param, "logit_bias");
}

TEST(RequestParser, EchoKeepsThePromptText) {
  const ParsedRequest r = parse_request(R"({"prompt": ["Hello there", "Bye"], "echo": true})", false, tiny().rc);
  EXPECT_TRUE(r.echo);
  ASSERT_EQ(r.echo_texts.size(), 2u);
  EXPECT_EQ(r.echo_texts[0], "Hello there");
  const ParsedRequest ids = parse_request(R"({"prompt": [300, 301], "echo": true})", false, tiny().rc);
  EXPECT_EQ(ids.echo_texts[0], tiny().tok->decode({300, 301}, false));
}

TEST(RequestParser, SuffixNeedsFillInTheMiddleTokens) {
  EXPECT_EQ(error_of(R"({"prompt": "def f(", "suffix": "return x"})", false).param, "suffix");
  Ctx qwen3((testing::fixtures_dir() / "tokenizers" / "qwen3").string());
  const ParsedRequest r = parse_request(R"({"prompt": "def f(", "suffix": "return x"})", false, qwen3.rc);
  const auto want = qwen3.tok->encode("<|fim_prefix|>def f(<|fim_suffix|>return x<|fim_middle|>", true);
  EXPECT_EQ(r.prompts[0], std::vector<int32_t>(want.begin(), want.end()));
}

TEST(RequestParser, ToolChoiceNoneHidesToolsAndArgumentsReachTheTemplateAsObjects) {
  const std::string tools =
      R"("tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}])";
  const std::string msgs = R"("messages": [{"role": "user", "content": "hi"},
      {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
       "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "sunny", "extra_key": {"ignored": true}}])";
  RequestContext rc = tiny().rc;
  // As vLLM: tools under tool_choice "auto" need --enable-auto-tool-choice (and a parser).
  const ApiError no_flag = error_of("{" + msgs + ", " + tools + "}", true, rc);
  EXPECT_EQ(no_flag.param, "tool_choice");
  EXPECT_NE(no_flag.message.find("--enable-auto-tool-choice"), std::string::npos) << no_flag.message;
  rc.auto_tool_choice = true;
  const ParsedRequest with_tools = parse_request("{" + msgs + ", " + tools + "}", true, rc);
  EXPECT_NE(with_tools.rendered_prompt.find("get_weather"), std::string::npos);
  EXPECT_NE(with_tools.rendered_prompt.find("{\"city\": \"Paris\"}"), std::string::npos) << with_tools.rendered_prompt;
  ASSERT_TRUE(with_tools.tools.is_array());
  EXPECT_EQ(with_tools.tools[0]["function"]["name"], "get_weather");
  const ParsedRequest none = parse_request("{" + msgs + ", " + tools + R"(, "tool_choice": "none"})", true, tiny().rc);
  EXPECT_EQ(none.rendered_prompt.find("# Tools"), std::string::npos) << none.rendered_prompt;
  EXPECT_TRUE(none.tools.is_null());
  EXPECT_NE(with_tools.rendered_prompt.find("# Tools"), std::string::npos);
  EXPECT_EQ(error_of("{" + msgs + ", " + tools + R"(, "tool_choice": "required"})", true, rc).param, "tool_choice");
}

TEST(RequestParser, FaultFieldOnlyWhenEnabled) {
  RequestContext rc = tiny().rc;
  rc.allow_fault_injection = true;
  const ParsedRequest r = parse_request(R"({"prompt": [1], "fathom_fault": {"site": "stop", "after_tokens": 4}})", false, rc);
  EXPECT_EQ(r.common.params.fault.site, FaultSite::Stop);
  EXPECT_EQ(r.common.params.fault.after_tokens, 4);
  EXPECT_EQ(error_of(R"({"prompt": [1], "fathom_fault": {"site": "disk"}})", false, rc).param, "fathom_fault");
}

TEST(RequestParser, LengthsAgainstTheContext) {
  RequestContext rc = tiny().rc;
  rc.max_model_len = 8;
  EXPECT_EQ(error_of(R"({"prompt": [1, 2, 3, 4, 5, 6, 7, 8, 9]})", false, rc).status, 400);  // as OpenAI and vLLM
  EXPECT_EQ(error_of(R"({"prompt": [1, 2, 3], "max_tokens": 6})", false, rc).code, "context_length_exceeded");
  EXPECT_EQ(parse_request(R"({"prompt": [1, 2, 3]})", false, rc).common.params.max_tokens, 5);
}

// The bodies vLLM's router and the SGLang gateway send (their added fields, as captured from
// vllm-router 0.1.17 and sglang-router 0.3.2) parse; each field's values take effect.
TEST(RequestParser, RouterFieldsAreAcceptedWithTheirMeaning) {
  const std::string chat_body =
      R"({"model": "m", "messages": [{"role": "user", "content": "hello"}], "stream": false, "max_tokens": 4,
          "logprobs": false, "no_stop_trim": false, "ignore_eos": false, "continue_final_message": false,
          "skip_special_tokens": true, "separate_reasoning": true, "stream_reasoning": true,
          "return_hidden_states": false, "include_reasoning": true})";
  const ParsedRequest c = parse_request(chat_body, true, tiny().rc);
  EXPECT_FALSE(c.common.params.include_stop_str_in_output);
  EXPECT_TRUE(c.reasoning.separate && c.reasoning.stream && c.reasoning.include);
  const std::string completion_body =
      R"({"model": "m", "prompt": "hello", "max_tokens": 4, "stream": false, "echo": false, "no_stop_trim": true,
          "ignore_eos": false, "skip_special_tokens": true, "return_hidden_states": false})";
  EXPECT_TRUE(parse_request(completion_body, false, tiny().rc).common.params.include_stop_str_in_output);
  const ParsedRequest off = parse_request(
      R"({"messages": [{"role": "user", "content": "x"}], "separate_reasoning": false, "stream_reasoning": false,
          "include_reasoning": false})",
      true, tiny().rc);
  EXPECT_FALSE(off.reasoning.separate || off.reasoning.stream || off.reasoning.include);
  EXPECT_EQ(error_of(R"({"prompt": "x", "return_hidden_states": true})", false).param, "return_hidden_states");
  EXPECT_EQ(error_of(R"({"prompt": "x", "no_stop_trim": 1})", false).code, "invalid_type");
  // Chat-only fields stay unknown on completions; fields neither family knows stay unknown.
  EXPECT_EQ(error_of(R"({"prompt": "x", "separate_reasoning": true})", false).code, "unknown_parameter");
  EXPECT_EQ(error_of(R"({"prompt": "x", "continue_final_message": true})", false).code, "unknown_parameter");
  EXPECT_EQ(error_of(R"({"messages": [{"role": "user", "content": "x"}], "frobnicate": 1})", true).code,
            "unknown_parameter");
}

// continue_final_message: the prompt ends with the assistant's text, not with its end of turn
// and not with a new assistant turn.
TEST(RequestParser, ContinueFinalMessageLeavesTheLastMessageOpen) {
  const std::string msgs =
      R"("messages": [{"role": "user", "content": "Tell me about the sea."}, {"role": "assistant", "content": "The sea is"}])";
  const ParsedRequest open = parse_request("{" + msgs + R"(, "continue_final_message": true})", true, tiny().rc);
  const std::string& p = open.rendered_prompt;
  ASSERT_GE(p.size(), 10u);
  EXPECT_EQ(p.substr(p.size() - 10), "The sea is") << p;
  const ParsedRequest closed =
      parse_request("{" + msgs + R"(, "add_generation_prompt": false})", true, tiny().rc);
  EXPECT_EQ(closed.rendered_prompt.rfind(p, 0), 0u) << closed.rendered_prompt;  // the same text, then the turn's end
  EXPECT_GT(closed.rendered_prompt.size(), p.size());
  const std::vector<uint32_t> ids = tiny().tok->encode(p, false);
  EXPECT_EQ(open.prompts[0], std::vector<int32_t>(ids.begin(), ids.end()));
  EXPECT_EQ(error_of("{" + msgs + R"(, "continue_final_message": true, "add_generation_prompt": true})", true).param,
            "continue_final_message");
  EXPECT_EQ(error_of(R"({"messages": [{"role": "user", "content": "x"}], "continue_final_message": true})", true).param,
            "continue_final_message");
}

// vLLM's /tokenize: the chat form renders as a chat request would; fields outside its two forms
// are refused by name.
TEST(RequestParser, TokenizeRequestsRenderAsTheEndpointsDo) {
  const std::string msgs = R"("messages": [{"role": "user", "content": "hello"}])";
  const ParsedRequest chat = parse_request("{" + msgs + "}", true, tiny().rc);
  EXPECT_EQ(parse_tokenize_request("{" + msgs + R"(, "continue_final_message": false})", tiny().rc).tokens, chat.prompts[0]);
  const TokenizeRequest t = parse_tokenize_request(R"({"model": "m", "prompt": "hello", "return_token_strs": true})", tiny().rc);
  EXPECT_EQ(t.tokens, parse_request(R"({"prompt": "hello"})", false, tiny().rc).prompts[0]);
  EXPECT_TRUE(t.return_token_strs);
  auto refused = [](const std::string& body) {
    try {
      parse_tokenize_request(body, tiny().rc);
    } catch (const ApiError& e) {
      return e.param;
    }
    return std::string("accepted");
  };
  EXPECT_EQ(refused(R"({"prompt": "x", "messages_": 1})"), "messages_");
  EXPECT_EQ(refused(R"({"prompt": "x", "add_generation_prompt": true})"), "add_generation_prompt");
  EXPECT_EQ(refused(R"({"model": "other", "prompt": "x"})"), "model");
  EXPECT_EQ(refused(R"({"model": "m"})"), "prompt");
}

// vLLM's /detokenize: the ids of /tokenize back to their text; anything else is refused by name.
TEST(RequestParser, DetokenizeTakesTokenIds) {
  const TokenizeRequest t = parse_tokenize_request(R"({"prompt": "hello world"})", tiny().rc);
  const std::string body = R"({"model": "m", "tokens": )" + json(t.tokens).dump() + "}";
  EXPECT_EQ(parse_detokenize_request(body, tiny().rc), t.tokens);
  auto refused = [](const std::string& b) {
    try {
      parse_detokenize_request(b, tiny().rc);
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      return e.param;
    }
    return std::string("accepted");
  };
  EXPECT_EQ(refused(R"({"tokens": [1], "prompt": "x"})"), "prompt");
  EXPECT_EQ(refused(R"({"model": "other", "tokens": [1]})"), "model");
  EXPECT_EQ(refused(R"({})"), "tokens");
  EXPECT_EQ(refused(R"({"tokens": "1"})"), "tokens");
  EXPECT_EQ(refused(R"({"tokens": [-1]})"), "tokens");
  EXPECT_EQ(refused(R"({"tokens": [1.5]})"), "tokens");
  EXPECT_EQ(refused(R"({"tokens": [)" + std::to_string(tiny().rc.vocab_size) + "]}"), "tokens");
}

}  // namespace
}  // namespace fathom::server
