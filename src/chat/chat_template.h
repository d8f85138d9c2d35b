// Chat templates: Hugging Face Jinja2 chat templates rendered byte-identically to transformers'
// apply_chat_template (jinja2 with trim_blocks, lstrip_blocks, loopcontrols, its tojson filter,
// raise_exception and strftime_now). JSON inputs are ordered_json so that key order (which
// tojson and dict printing expose) is kept as in the request.
#pragma once
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

namespace fathom::chat {

class ChatTemplate {
 public:
  // Parses the template; throws fathom::Error with line:col on syntax errors.
  explicit ChatTemplate(std::string source);

  // Renders like apply_chat_template(messages, tools=tools or None, add_generation_prompt, **kwargs):
  // variables are messages, tools (None when null), documents (None), add_generation_prompt, then the
  // special tokens (bos_token, eos_token, ...), then extra_kwargs (enable_thinking, ...) which win.
  std::string render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                     bool add_generation_prompt,
                     const nlohmann::ordered_json& extra_kwargs = nlohmann::ordered_json::object(),
                     const nlohmann::ordered_json& special_tokens = nlohmann::ordered_json::object()) const;

  // Renders with an explicit set of template variables (a JSON object).
  std::string render_variables(const nlohmann::ordered_json& variables) const;

  const std::string& source() const;

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

struct ChatTemplateSource {
  std::string source;
  nlohmann::ordered_json special_tokens = nlohmann::ordered_json::object();  // bos_token etc. as strings
};

// Loads a chat template from a model/tokenizer folder (chat_template.jinja, else the
// "chat_template" of tokenizer_config.json), a tokenizer_config.json, or a .jinja file. A list of
// {name, template} picks "default". Special tokens come from tokenizer_config.json when present.
ChatTemplateSource load_chat_template(const std::filesystem::path& path);

}  // namespace fathom::chat
