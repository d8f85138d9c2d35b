#include "server/protocol.h"

#include <cmath>
#include <limits>
#include <random>

namespace fathom::server {

using json = nlohmann::ordered_json;

std::string error_type(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 413: return "invalid_request_error";
    case 429: return "rate_limit_error";
    case 500: return "server_error";
    case 503: return "service_unavailable";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

json error_json(const ApiError& e) {
  json err = {{"message", e.message},
              {"type", error_type(e.status)},
              {"param", e.param.empty() ? json(nullptr) : json(e.param)},
              {"code", e.code.empty() ? json(nullptr) : json(e.code)}};
  return json{{"error", err}};
}

[[noreturn]] static void bad(const std::string& param, const std::string& msg, const std::string& code = "invalid_value") {
  throw ApiError{400, msg, param, code};
}

static std::string range_text(double lo, double hi) {
  auto f = [](double v) {
    if (v == std::floor(v) && std::fabs(v) < 1e15) return std::to_string(int64_t(v));
    std::string s = std::to_string(v);
    while (!s.empty() && s.back() == '0') s.pop_back();
    return s;
  };
  return "[" + f(lo) + ", " + f(hi) + "]";
}

std::optional<double> get_number(const json& j, const char* key, double lo, double hi) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) bad(key, std::string("'") + key + "' must be a number", "invalid_type");
  double v = it->get<double>();
  if (!std::isfinite(v) || v < lo || v > hi)
    bad(key, std::string("'") + key + "' must be in " + range_text(lo, hi) + ", got " + it->dump());
  return v;
}

std::optional<int64_t> get_int(const json& j, const char* key, int64_t lo, int64_t hi) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  int64_t v;
  if (it->is_number_integer()) {
    if (it->is_number_unsigned() && it->get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
      bad(key, std::string("'") + key + "' is out of range");
    v = it->get<int64_t>();
  } else if (it->is_number_float()) {
    double d = it->get<double>();
    if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9e15)
      bad(key, std::string("'") + key + "' must be an integer", "invalid_type");
    v = int64_t(d);
  } else {
    bad(key, std::string("'") + key + "' must be an integer", "invalid_type");
  }
  if (v < lo || v > hi) bad(key, std::string("'") + key + "' must be in " + range_text(double(lo), double(hi)) + ", got " + std::to_string(v));
  return v;
}

std::optional<bool> get_bool(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) bad(key, std::string("'") + key + "' must be a boolean", "invalid_type");
  return it->get<bool>();
}

std::optional<std::string> get_string(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) bad(key, std::string("'") + key + "' must be a string", "invalid_type");
  return it->get<std::string>();
}

CommonParams parse_common(const json& b, bool chat, int64_t vocab, bool have_tok) {
  CommonParams c;
  RequestParams& p = c.params;
  SamplingParams& s = p.sampling;
  s.temperature = 1.f;  // OpenAI's default
  if (auto v = get_number(b, "temperature", 0, 2)) s.temperature = float(*v);
  if (auto v = get_number(b, "top_p", 0, 1)) {
    if (*v <= 0) bad("top_p", "'top_p' must be in (0, 1], got " + b["top_p"].dump());
    s.top_p = float(*v);
  }
  if (auto v = get_int(b, "top_k", -1, 1 << 30)) s.top_k = int(*v < 0 ? 0 : *v);
  if (auto v = get_number(b, "min_p", 0, 1)) s.min_p = float(*v);
  if (auto v = get_number(b, "presence_penalty", -2, 2)) s.presence_penalty = float(*v);
  if (auto v = get_number(b, "frequency_penalty", -2, 2)) s.frequency_penalty = float(*v);
  if (auto v = get_number(b, "repetition_penalty", 0, 100)) {
    if (*v <= 0) bad("repetition_penalty", "'repetition_penalty' must be > 0");
    s.repetition_penalty = float(*v);
  }
  if (auto v = get_int(b, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max())) {
    s.seed = uint64_t(*v);
    c.seed_given = true;
  }
  if (auto v = get_int(b, "n", 1, 128)) c.n = int(*v);
  // max_completion_tokens (chat) wins over the legacy max_tokens.
  std::optional<int64_t> mt = get_int(b, "max_tokens", 1, std::numeric_limits<int32_t>::max());
  if (chat)
    if (auto v = get_int(b, "max_completion_tokens", 1, std::numeric_limits<int32_t>::max())) mt = v;
  c.max_tokens = mt;
  if (auto v = get_int(b, "min_tokens", 0, std::numeric_limits<int32_t>::max())) p.min_tokens = int(*v);
  if (c.max_tokens && p.min_tokens > *c.max_tokens) bad("min_tokens", "'min_tokens' must not exceed max_tokens");
  if (auto it = b.find("stop"); it != b.end() && !it->is_null()) {
    if (it->is_string()) {
      p.stop.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      if (it->size() > 64) bad("stop", "at most 64 stop sequences are allowed");
      for (const auto& e : *it) {
        if (!e.is_string()) bad("stop", "'stop' must be a string or a list of strings", "invalid_type");
        p.stop.push_back(e.get<std::string>());
      }
    } else {
      bad("stop", "'stop' must be a string or a list of strings", "invalid_type");
    }
    for (const auto& st : p.stop)
      if (st.empty()) bad("stop", "stop sequences must not be empty");
    if (!p.stop.empty() && !have_tok) bad("stop", "stop strings need a tokenizer (server runs with --skip-tokenizer-init)");
  }
  if (auto it = b.find("stop_token_ids"); it != b.end() && !it->is_null()) {
    if (!it->is_array()) bad("stop_token_ids", "'stop_token_ids' must be a list of integers", "invalid_type");
    for (const auto& e : *it) {
      if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() >= vocab)
        bad("stop_token_ids", "'stop_token_ids' must hold token ids in [0, " + std::to_string(vocab) + ")");
      p.stop_token_ids.push_back(int32_t(e.get<int64_t>()));
    }
  }
  if (auto v = get_bool(b, "ignore_eos")) p.ignore_eos = *v;
  if (auto v = get_bool(b, "include_stop_str_in_output")) p.include_stop_str_in_output = *v;
  if (auto v = get_bool(b, "skip_special_tokens")) p.skip_special_tokens = *v;
  if (auto v = get_bool(b, "stream")) c.stream = *v;
  if (auto v = get_bool(b, "return_token_ids")) c.return_token_ids = *v;
  if (auto it = b.find("stream_options"); it != b.end() && !it->is_null()) {
    if (!it->is_object()) bad("stream_options", "'stream_options' must be an object", "invalid_type");
    if (!c.stream) bad("stream_options", "'stream_options' is only allowed when 'stream' is true");
    if (auto v = get_bool(*it, "include_usage")) c.include_usage = *v;
  }
  if (chat) {
    bool lp = get_bool(b, "logprobs").value_or(false);
    auto top = get_int(b, "top_logprobs", 0, 20);
    if (top && !lp) bad("top_logprobs", "'top_logprobs' needs 'logprobs' set to true");
    if (lp) p.logprobs = int(top.value_or(0));
  } else {
    if (auto it = b.find("logprobs"); it != b.end() && it->is_boolean())
      bad("logprobs", "'logprobs' must be an integer for completions", "invalid_type");
    if (auto v = get_int(b, "logprobs", 0, 20)) p.logprobs = int(*v);
  }
  if (auto it = b.find("logit_bias"); it != b.end() && !it->is_null()) {
    // OpenAI: {"token id": bias in [-100, 100]}, the bias added to the token's logit.
    if (!it->is_object()) bad("logit_bias", "'logit_bias' must be an object of token id -> bias", "invalid_type");
    for (auto e = it->begin(); e != it->end(); ++e) {
      const std::string& key = e.key();
      int64_t id = -1;
      const bool digits = !key.empty() && key.size() <= 12 && key.find_first_not_of("0123456789") == std::string::npos;
      if (digits) id = std::stoll(key);
      if (id < 0 || id >= vocab)
        bad("logit_bias", "'logit_bias' key '" + key + "' is not a token id of the vocabulary [0, " + std::to_string(vocab) + ")");
      if (!e.value().is_number()) bad("logit_bias", "'logit_bias' values must be numbers", "invalid_type");
      const double v = e.value().get<double>();
      if (!std::isfinite(v) || v < -100 || v > 100)
        bad("logit_bias", "'logit_bias' value for token " + key + " must be in [-100, 100], got " + e.value().dump());
      s.logit_bias.emplace_back(int32_t(id), float(v));
    }
  }
  if (!c.seed_given) {
    static thread_local std::mt19937_64 gen{std::random_device{}()};
    s.seed = gen();
  }
  return c;
}

}  // namespace fathom::server
