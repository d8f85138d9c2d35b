// `fathom score` and `fathom generate` end to end on the fixtures: the .npy written by score holds
// the transformers golden logits (max |err| below 1e-3 of their spread, as in tests/model), and
// generate --json returns the golden greedy continuation.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/npy.h"
#include "io/safetensors.h"

namespace fathom {
namespace {

namespace fs = std::filesystem;

std::string run(const std::string& args, int* status) {
  const std::string cmd = std::string("'") + FATHOM_BINARY + "' " + args;
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while (p && (n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int st = p ? pclose(p) : -1;
  *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return out;
}

template <class T>
std::vector<T> read(const SafetensorsFile& f, const std::string& name) {
  const TensorInfo* t = f.find(name);
  EXPECT_NE(t, nullptr) << name;
  if (!t) return {};
  std::vector<T> v(t->numel());
  if constexpr (std::is_same_v<T, float>) {
    convert_to_f32(t->dtype, f.bytes(*t).data(), v.data(), v.size());
  } else {
    EXPECT_EQ(t->dtype, DType::I32);
    std::memcpy(v.data(), f.bytes(*t).data(), v.size() * 4);
  }
  return v;
}

std::string join(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s;
}

class CliFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(CliFixture, ScoreWritesGoldenLogitsAndGenerateGoldenTokens) {
  const fs::path dir = fs::path(FATHOM_FIXTURES_DIR) / GetParam();
  auto golden = SafetensorsFile::open(dir / "goldens.safetensors");
  const auto prompt = read<int32_t>(*golden, "prompt_1");
  const auto logits = read<float>(*golden, "logits_1");
  const auto greedy = read<int32_t>(*golden, "greedy_1");
  const auto margin = read<float>(*golden, "greedy_margin_1");

  const fs::path npy = fs::temp_directory_path() / ("fathom_score_" + GetParam() + ".npy");
  int status = 0;
  std::string out;
  // Whole, and split over ranks (threads of the CPU engine): the same golden either way.
  for (const std::string split : {"", " --tp 2", " --tensor-parallel-size 4 --enable-expert-parallel"}) {
    out = run("score '" + dir.string() + "' --token-ids " + join(prompt) + " --logits-out '" + npy.string() +
                  "' --prefill-chunk 7" + split + " 2>&1",
              &status);
    ASSERT_EQ(status, 0) << out;
    NpyArray a = read_npy_f32(npy);
    fs::remove(npy);
    ASSERT_EQ(a.shape.size(), 2u);
    EXPECT_EQ(a.shape[0], int64_t(prompt.size()));
    ASSERT_EQ(a.data.size(), logits.size());
    auto [mn, mx] = std::minmax_element(logits.begin(), logits.end());
    double err = 0;
    for (size_t i = 0; i < logits.size(); ++i) err = std::max(err, double(std::fabs(a.data[i] - logits[i])));
    EXPECT_LT(err / double(*mx - *mn), 1e-3) << split;
  }

  out = run("generate '" + dir.string() + "' --token-ids " + join(prompt) + " --max-new-tokens " +
                std::to_string(greedy.size()) + " --ignore-eos --json --tp 2",  // stdout only: the JSON (logs go to stderr)
            &status);
  ASSERT_EQ(status, 0) << out;
  auto j = nlohmann::json::parse(out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << out;
  const auto ids = j["token_ids"].get<std::vector<int32_t>>();
  ASSERT_EQ(ids.size(), greedy.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] != greedy[i]) {
      EXPECT_LE(margin[i], 1e-2f) << "step " << i;
      break;
    }
  }
}

// `score --mtp-logits-out`: the MTP layer's logits at every position (row t: the hidden state at
// t and token t + 1) are the transformers golden's (tools/make_fixtures.py, mtp_logits_1), for the
// fixtures with an MTP layer; one without refuses the flag by name.
TEST(Cli, ScoreWritesGoldenMtpLogits) {
  for (const std::string name : {"qwen35_moe", "qwen35_moe_nvfp4"}) {
    const fs::path dir = fs::path(FATHOM_FIXTURES_DIR) / name;
    auto golden = SafetensorsFile::open(dir / "goldens.safetensors");
    const auto prompt = read<int32_t>(*golden, "prompt_1");
    const auto mtp = read<float>(*golden, "mtp_logits_1");
    const fs::path main_npy = fs::temp_directory_path() / ("fathom_score_main_" + name + ".npy");
    const fs::path mtp_npy = fs::temp_directory_path() / ("fathom_score_mtp_" + name + ".npy");
    int status = 0;
    const std::string out = run("score '" + dir.string() + "' --token-ids " + join(prompt) + " --logits-out '" +
                                    main_npy.string() + "' --mtp-logits-out '" + mtp_npy.string() +
                                    "' --prefill-chunk 7 2>&1",
                                &status);
    ASSERT_EQ(status, 0) << out;
    NpyArray a = read_npy_f32(mtp_npy);
    fs::remove(main_npy);
    fs::remove(mtp_npy);
    ASSERT_EQ(a.shape.size(), 2u);
    EXPECT_EQ(a.shape[0], int64_t(prompt.size()) - 1);
    ASSERT_EQ(a.data.size(), mtp.size());
    auto [mn, mx] = std::minmax_element(mtp.begin(), mtp.end());
    double err = 0;
    for (size_t i = 0; i < mtp.size(); ++i) err = std::max(err, double(std::fabs(a.data[i] - mtp[i])));
    EXPECT_LT(err / double(*mx - *mn), 1e-3) << name;
  }
  int status = 0;
  const std::string out = run("score '" + (fs::path(FATHOM_FIXTURES_DIR) / "qwen3_dense").string() +
                                  "' --token-ids 1,2,3 --logits-out /tmp/x.npy --mtp-logits-out /tmp/y.npy 2>&1",
                              &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("--mtp-logits-out"), std::string::npos) << out;
}

TEST(Cli, BadInputsGiveOneLineErrors) {
  int status = 0;
  std::string out = run("generate /nonexistent/model --token-ids 1,2 2>&1", &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("error:"), std::string::npos) << out;
  out = run("score '" + (fs::path(FATHOM_FIXTURES_DIR) / "qwen3_dense").string() +
                "' --token-ids 1,x,3 --logits-out /tmp/x.npy 2>&1",
            &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("--token-ids"), std::string::npos) << out;
  out = run("generate '" + (fs::path(FATHOM_FIXTURES_DIR) / "qwen3_dense").string() +
                "' --token-ids 1,99999 2>&1",
            &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("vocabulary"), std::string::npos) << out;
  out = run("generate '" + (fs::path(FATHOM_FIXTURES_DIR) / "qwen3_dense").string() + "' --token-ids 1,2 --tp 3 2>&1",
            &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("attention heads (4) do not split over 3 ranks"), std::string::npos) << out;
}

// `fathom chat` answers with what the separate steps give: the chat template rendered with the
// generation prompt, tokenized without added specials, greedy generation cut at the first
// end-of-turn or eos token, decoded without special tokens. And a conversation read from stdin
// gets one answer a line.
TEST(Cli, ChatAnswerEqualsTemplateTokenizeGenerateDecode) {
  const std::string dir = (fs::path(FATHOM_FIXTURES_DIR) / "qwen35_moe").string();
  const fs::path tmp = fs::temp_directory_path() / "fathom_chat_test";
  fs::create_directories(tmp);
  const std::string messages = (tmp / "messages.json").string(), texts = (tmp / "texts.json").string();
  std::ofstream(messages) << R"([{"role": "user", "content": "Hello there, who are you?"}])";
  int status = 0;
  const std::string rendered =
      run("chat-template '" + dir + "' --messages '" + messages + "' --add-generation-prompt --no-thinking", &status);
  ASSERT_EQ(status, 0) << rendered;
  std::ofstream(texts) << nlohmann::json::array({rendered}).dump();
  const std::string ids_json = run("tokenize '" + dir + "' --input-json '" + texts + "' --no-special", &status);
  ASSERT_EQ(status, 0) << ids_json;
  const auto prompt = nlohmann::json::parse(ids_json)[0].get<std::vector<int32_t>>();
  const std::string gen = run("generate '" + dir + "' --token-ids " + join(prompt) +
                                  " --max-new-tokens 12 --ignore-eos --device cpu --json",
                              &status);
  ASSERT_EQ(status, 0) << gen;
  std::vector<int32_t> out = nlohmann::json::parse(gen)["token_ids"].get<std::vector<int32_t>>();
  const auto cfg = nlohmann::json::parse(std::ifstream(fs::path(dir) / "tokenizer_config.json"));
  std::vector<int32_t> stops = {1};  // the fixtures' eos
  for (const auto& [id, tok] : cfg["added_tokens_decoder"].items())
    if (tok["content"] == "<|im_end|>" || tok["content"] == "<|endoftext|>") stops.push_back(std::stoi(id));
  for (size_t i = 0; i < out.size(); ++i)
    if (std::find(stops.begin(), stops.end(), out[i]) != stops.end()) {
      out.resize(i);
      break;
    }
  // detokenize prints the text and a newline, as chat ends each answer.
  const std::string want =
      out.empty() ? "\n" : run("detokenize '" + dir + "' --ids " + join(out) + " --skip-special-tokens", &status);
  const std::string got = run("chat '" + dir + "' --prompt 'Hello there, who are you?' --max-new-tokens 12 --device cpu",
                              &status);
  ASSERT_EQ(status, 0) << got;
  EXPECT_EQ(got, want);
  const std::string two =
      run("chat '" + dir + "' --max-new-tokens 4 --device cpu < /dev/null", &status);  // no input: no answer
  EXPECT_EQ(status, 0);
  EXPECT_EQ(two, "");
  fs::remove_all(tmp);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CliFixture,
                         ::testing::Values("qwen35_moe", "qwen35_moe_nvfp4", "qwen3_next", "qwen3_dense"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace fathom
