// --api-key (server/api_key.h): the comparison, which headers carry the key on which paths.
#include <gtest/gtest.h>

#include "server/api_key.h"

namespace fathom::server {
namespace {

HttpRequest with(std::string path, HttpHeaders headers) {
  HttpRequest r;
  r.method = "POST";
  r.path = std::move(path);
  r.headers = std::move(headers);
  return r;
}

TEST(ApiKey, ConstantTimeEqualCompares) {
  EXPECT_TRUE(constant_time_equal("", ""));
  EXPECT_TRUE(constant_time_equal("sk-abc", "sk-abc"));
  EXPECT_FALSE(constant_time_equal("sk-abc", "sk-abd"));
  EXPECT_FALSE(constant_time_equal("sk-abc", "sk-ab"));   // a prefix is not the key
  EXPECT_FALSE(constant_time_equal("sk-ab", "sk-abc"));
  EXPECT_FALSE(constant_time_equal("", "k"));
  EXPECT_FALSE(constant_time_equal(std::string("a\0b", 3), "a"));  // bytes past a NUL count
}

TEST(ApiKey, BearerOnEveryRoute) {
  EXPECT_TRUE(request_has_api_key(with("/v1/chat/completions", {{"authorization", "Bearer k1"}}), "k1"));
  EXPECT_TRUE(request_has_api_key(with("/v1/messages", {{"authorization", "Bearer k1"}}), "k1"));
  EXPECT_FALSE(request_has_api_key(with("/v1/chat/completions", {{"authorization", "Bearer k2"}}), "k1"));
  EXPECT_FALSE(request_has_api_key(with("/v1/chat/completions", {{"authorization", "k1"}}), "k1"));
  EXPECT_FALSE(request_has_api_key(with("/v1/chat/completions", {{"authorization", "Basic k1"}}), "k1"));
  EXPECT_FALSE(request_has_api_key(with("/v1/chat/completions", {}), "k1"));
}

TEST(ApiKey, XApiKeyOnAnthropicRoutesOnly) {
  EXPECT_TRUE(request_has_api_key(with("/v1/messages", {{"x-api-key", "k1"}}), "k1"));
  EXPECT_TRUE(request_has_api_key(with("/v1/messages/count_tokens", {{"x-api-key", "k1"}}), "k1"));
  EXPECT_FALSE(request_has_api_key(with("/v1/messages", {{"x-api-key", "k2"}}), "k1"));
  EXPECT_FALSE(request_has_api_key(with("/v1/messages", {{"x-api-key", ""}}), "k1"));
  // OpenAI's routes keep OpenAI's header alone, as vLLM.
  EXPECT_FALSE(request_has_api_key(with("/v1/chat/completions", {{"x-api-key", "k1"}}), "k1"));
}

}  // namespace
}  // namespace fathom::server
