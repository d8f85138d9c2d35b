// `fathom chat-template PATH --messages FILE [--tools FILE] [--no-thinking]
//  [--add-generation-prompt] [--kwargs JSON]`: renders a chat template to stdout, byte-exact.
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include "chat/chat_template.h"
#include "cli/command.h"
#include "core/error.h"

namespace fathom::cli {
namespace {

struct ChatTemplateOptions {
  std::string path, messages, tools, kwargs;
  bool no_thinking = false, add_generation_prompt = false;
};

nlohmann::ordered_json read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  FATHOM_CHECK(in, "cannot open ", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  try {
    return nlohmann::ordered_json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    fail(path, ": invalid JSON: ", e.what());
  }
}

void run(const ChatTemplateOptions& o) {
  auto loaded = chat::load_chat_template(o.path);
  chat::ChatTemplate tmpl(loaded.source);
  nlohmann::ordered_json messages = read_json_file(o.messages);
  nlohmann::ordered_json tools = o.tools.empty() ? nlohmann::ordered_json(nullptr) : read_json_file(o.tools);
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();
  if (!o.kwargs.empty()) {
    try {
      kwargs = nlohmann::ordered_json::parse(o.kwargs);
    } catch (const nlohmann::json::exception& e) {
      fail("--kwargs: invalid JSON: ", e.what());
    }
    FATHOM_CHECK(kwargs.is_object(), "--kwargs must be a JSON object");
  }
  if (o.no_thinking) kwargs["enable_thinking"] = false;
  std::string out = tmpl.render(messages, tools, o.add_generation_prompt, kwargs, loaded.special_tokens);
  std::fwrite(out.data(), 1, out.size(), stdout);
  std::fflush(stdout);
}

const CommandRegistrar registrar([](CLI::App& app) {
  auto opts = std::make_shared<ChatTemplateOptions>();
  auto* cmd = app.add_subcommand("chat-template", "Render a chat template (Jinja2) for a conversation");
  cmd->add_option("path", opts->path, "Model/tokenizer folder, tokenizer_config.json or .jinja file")->required();
  cmd->add_option("--messages", opts->messages, "JSON file with the list of messages")->required();
  cmd->add_option("--tools", opts->tools, "JSON file with the list of tool schemas");
  cmd->add_flag("--no-thinking", opts->no_thinking, "Set enable_thinking=false");
  cmd->add_flag("--add-generation-prompt", opts->add_generation_prompt, "Append the assistant turn header");
  cmd->add_option("--kwargs", opts->kwargs, "JSON object of extra template variables");
  cmd->callback([opts]() { run(*opts); });
});

}  // namespace
}  // namespace fathom::cli
