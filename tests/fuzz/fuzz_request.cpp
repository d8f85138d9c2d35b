// libFuzzer target: arbitrary bytes as the body of /v1/chat/completions, /v1/completions,
// /v1/messages (and count_tokens), /v1/responses and /detokenize,
// through the whole request path before the engine: JSON with the nesting limit, field checks,
// message sanitizing, JSON -> template values, rendering with a real chat template (Qwen3's,
// from the tiny fixture model), tokenizing, length checks. Only ApiError (a 4xx for the client)
// may escape; anything else, like a crash or a stack overflow, is a bug.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "chat/chat_template.h"
#include "server/anthropic_messages.h"
#include "server/openai_responses.h"
#include "server/request_parser.h"
#include "tokenizer/tokenizer.h"

namespace {

struct Context {
  std::unique_ptr<fathom::tok::Tokenizer> tok;
  std::unique_ptr<fathom::chat::ChatTemplate> tmpl;
  fathom::server::RequestContext ctx;
  Context() {
    const std::string model = std::string(FATHOM_FUZZ_FIXTURES_DIR) + "/qwen35_moe";
    tok = std::make_unique<fathom::tok::Tokenizer>(fathom::tok::Tokenizer::from_dir(model));
    auto src = fathom::chat::load_chat_template(model);
    tmpl = std::make_unique<fathom::chat::ChatTemplate>(src.source);
    ctx.tokenizer = tok.get();
    ctx.chat_template = tmpl.get();
    ctx.special_tokens = src.special_tokens;
    ctx.model_names = {"m"};
    ctx.vocab_size = 512;
    ctx.max_model_len = 4096;
    ctx.allow_fault_injection = true;
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Context c;
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  for (bool chat : {true, false}) {
    try {
      (void)fathom::server::parse_request(body, chat, c.ctx);
    } catch (const fathom::server::ApiError& e) {
      if (e.status < 400 || e.status >= 500) __builtin_trap();  // a client error must be a 4xx
    }
  }
  // /v1/messages and count_tokens: the Anthropic body translated, then run as the chat body it is.
  for (bool count : {false, true}) {
    try {
      const auto ar = fathom::server::translate_anthropic_request(body, count);
      (void)fathom::server::parse_request(ar.chat_body.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace), true, c.ctx);
    } catch (const fathom::server::ApiError& e) {
      if (e.status < 400 || e.status >= 500) __builtin_trap();
    }
  }
  // /v1/responses: the body translated (with a store holding one conversation), then run as chat.
  static fathom::server::ResponseStore store(2);
  static const bool seeded = (store.put("resp_a", nlohmann::ordered_json::array({{{"role", "user"}, {"content", "hi"}}})), true);
  (void)seeded;
  try {
    const auto rr = fathom::server::translate_responses_request(body, store);
    (void)fathom::server::parse_request(rr.chat_body.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace), true, c.ctx);
  } catch (const fathom::server::ApiError& e) {
    if (e.status < 400 || e.status >= 500) __builtin_trap();
  }
  try {
    (void)fathom::server::parse_detokenize_request(body, c.ctx);
  } catch (const fathom::server::ApiError& e) {
    if (e.status < 400 || e.status >= 500) __builtin_trap();
  }
  return 0;
}
