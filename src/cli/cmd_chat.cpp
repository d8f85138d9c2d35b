// `fathom chat MODEL [--prompt TEXT] [--system TEXT] [--max-new-tokens N] [--temperature T]
//  [--thinking] [--device ...]`: a conversation with a model in the terminal, through the model's
// own chat template and tokenizer. With --prompt it answers that one message and exits;
// otherwise it reads one user message a line from standard input until end of input, keeping the
// conversation. Answers are printed as text.
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "cli/cli_common.h"
#include "cli/command.h"
#include "core/error.h"
#include "model/model_runner.h"
#include "runtime/offline_generate.h"
#include "tokenizer/tokenizer.h"

namespace fathom::cli {
namespace {

struct ChatArgs {
  std::string model, prompt, system, device = "auto";
  int max_new_tokens = 256;
  bool thinking = false;
  SamplingParams sampling;
  TensorParallelism parallel;
};

// The model's answer to `messages` (rendered with the generation prompt).
std::string answer(ModelRunner& runner, const tok::Tokenizer& tokenizer, const chat::ChatTemplate& tmpl,
                   const chat::ChatTemplateSource& source, const nlohmann::ordered_json& messages,
                   const GenerateOptions& opt, bool thinking) {
  nlohmann::ordered_json kwargs = {{"enable_thinking", thinking}};
  const std::string text = tmpl.render(messages, nullptr, /*add_generation_prompt=*/true, kwargs, source.special_tokens);
  const std::vector<uint32_t> ids = tokenizer.encode(text, /*add_special_tokens=*/false);
  const std::vector<int32_t> prompt(ids.begin(), ids.end());
  const GenerateResult r = generate(runner, prompt, opt);
  std::vector<uint32_t> out;
  for (int32_t t : r.token_ids)
    if (std::find(opt.stop_token_ids.begin(), opt.stop_token_ids.end(), t) == opt.stop_token_ids.end())
      out.push_back(uint32_t(t));
  return tokenizer.decode(out, /*skip_special_tokens=*/true);
}

void run_chat(const ChatArgs& a) {
  const tok::Tokenizer tokenizer = tok::Tokenizer::from_dir(a.model);
  const chat::ChatTemplateSource source = chat::load_chat_template(a.model);
  const chat::ChatTemplate tmpl(source.source);
  EngineOptions eo;
  eo.parallel = a.parallel;
  auto runner = open_model(a.model, a.device, /*with_mtp=*/false, eo);
  GenerateOptions opt;
  opt.max_new_tokens = a.max_new_tokens;
  opt.sampling = a.sampling;
  opt.stop_token_ids = runner->config().eos_token_ids;
  for (const char* end : {"<|im_end|>", "<|endoftext|>"})  // the turn ends at either
    if (auto id = tokenizer.token_to_id(end)) opt.stop_token_ids.push_back(int(*id));

  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  if (!a.system.empty()) messages.push_back({{"role", "system"}, {"content", a.system}});
  auto turn = [&](const std::string& user) {
    messages.push_back({{"role", "user"}, {"content", user}});
    const std::string reply = answer(*runner, tokenizer, tmpl, source, messages, opt, a.thinking);
    messages.push_back({{"role", "assistant"}, {"content", reply}});
    std::printf("%s\n", reply.c_str());
    std::fflush(stdout);
  };
  if (!a.prompt.empty()) return turn(a.prompt);
  std::string line;
  while (std::getline(std::cin, line))
    if (!line.empty()) turn(line);
}

CommandRegistrar reg([](CLI::App& app) {
  auto args = std::make_shared<ChatArgs>();
  CLI::App* sub = app.add_subcommand("chat", "Chat with a model through its chat template (text in, text out)");
  sub->add_option("model", args->model, "Checkpoint folder with tokenizer.json and a chat template")->required();
  sub->add_option("--prompt", args->prompt, "Answer this one message and exit (default: read messages from stdin)");
  sub->add_option("--system", args->system, "A system message first");
  sub->add_option("--max-new-tokens", args->max_new_tokens, "Tokens an answer may have at most")->capture_default_str();
  sub->add_option("--temperature", args->sampling.temperature, "0 = greedy")->capture_default_str();
  sub->add_option("--top-p", args->sampling.top_p, "Nucleus sampling mass");
  sub->add_option("--seed", args->sampling.seed, "Sampling seed");
  sub->add_flag("--thinking", args->thinking, "Let the template open a <think> block (enable_thinking)");
  sub->add_option("--device", args->device, "auto (cuda when a GPU is visible), cpu or cuda")->capture_default_str();
  add_parallel_options(sub, args->parallel);
  sub->callback([args] { run_chat(*args); });
});

}  // namespace
}  // namespace fathom::cli
