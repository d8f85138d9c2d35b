#include "chat/chat_template.h"

#include <fstream>
#include <sstream>

#include "chat/builtins.h"
#include "chat/interpreter.h"
#include "chat/lexer.h"
#include "chat/parser.h"
#include "core/error.h"

namespace fathom::chat {

struct ChatTemplate::Impl {
  std::string original;
  std::string src;
  std::unique_ptr<SourceMap> map;
  std::vector<NodePtr> body;
};

namespace {

// jinja2 resolves filter and test names when compiling, so unknown ones fail even in dead code.
void check_names(const std::vector<NodePtr>& nodes, const SourceMap& map);
void check_node(const NodePtr& n, const SourceMap& map) {
  if (!n) return;
  auto bad = [&](const char* what) {
    auto [line, col] = map.position(n->offset);
    fail("chat template syntax error at line ", line, ":", col, ": no ", what, " named '", n->name, "'");
  };
  if (n->kind == NodeKind::Filter && !find_filter(n->name)) bad("filter");
  if (n->kind == NodeKind::Test && !find_test(n->name)) bad("test");
  check_node(n->a, map);
  check_node(n->b, map);
  check_node(n->c, map);
  check_node(n->filter, map);
  check_names(n->items, map);
  check_names(n->kwvalues, map);
  check_names(n->body, map);
  check_names(n->else_body, map);
}
void check_names(const std::vector<NodePtr>& nodes, const SourceMap& map) {
  for (const auto& n : nodes) check_node(n, map);
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  FATHOM_CHECK(in, "cannot open ", p.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string template_from_config(const nlohmann::ordered_json& cfg, const std::string& where) {
  FATHOM_CHECK(cfg.is_object() && cfg.contains("chat_template"), where, ": no chat_template field");
  const auto& ct = cfg["chat_template"];
  if (ct.is_string()) return ct.get<std::string>();
  if (ct.is_array()) {
    for (const auto& e : ct)
      if (e.is_object() && e.value("name", "") == "default" && e.contains("template") && e["template"].is_string())
        return e["template"].get<std::string>();
    fail(where, ": chat_template list has no template named \"default\"");
  }
  fail(where, ": chat_template must be a string or a list of {name, template}");
}

nlohmann::ordered_json special_tokens_from_config(const nlohmann::ordered_json& cfg) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  static const char* names[] = {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"};
  for (const char* n : names) {
    if (!cfg.contains(n)) continue;
    const auto& t = cfg[n];
    if (t.is_string()) out[n] = t;
    else if (t.is_object() && t.contains("content") && t["content"].is_string()) out[n] = t["content"];
  }
  return out;
}

nlohmann::ordered_json parse_json_file(const std::filesystem::path& p) {
  try {
    return nlohmann::ordered_json::parse(read_file(p));
  } catch (const nlohmann::json::exception& e) {
    fail(p.string(), ": invalid JSON: ", e.what());
  }
}

}  // namespace

ChatTemplate::ChatTemplate(std::string source) {
  auto impl = std::make_shared<Impl>();
  impl->original = std::move(source);
  impl->src = normalize_template_source(impl->original);
  impl->map = std::make_unique<SourceMap>(impl->src);
  auto tokens = tokenize(impl->src, *impl->map);
  impl->body = parse_template(tokens, *impl->map);
  check_names(impl->body, *impl->map);
  impl_ = impl;
}

const std::string& ChatTemplate::source() const { return impl_->original; }

std::string ChatTemplate::render_variables(const nlohmann::ordered_json& variables) const {
  FATHOM_CHECK(variables.is_object(), "chat template variables must be a JSON object");
  Value globals = Value::new_dict();
  install_globals(globals);
  for (auto it = variables.begin(); it != variables.end(); ++it) globals.dict->set(it.key(), Value::from_json(it.value()));
  Interpreter interp(*impl_->map);
  return interp.render(impl_->body, globals);
}

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                 bool add_generation_prompt, const nlohmann::ordered_json& extra_kwargs,
                                 const nlohmann::ordered_json& special_tokens) const {
  nlohmann::ordered_json vars = nlohmann::ordered_json::object();
  vars["messages"] = messages;
  vars["tools"] = tools;  // null -> None, as transformers passes tools=None
  vars["documents"] = nullptr;
  vars["add_generation_prompt"] = add_generation_prompt;
  if (special_tokens.is_object())
    for (auto it = special_tokens.begin(); it != special_tokens.end(); ++it) vars[it.key()] = it.value();
  if (extra_kwargs.is_object())
    for (auto it = extra_kwargs.begin(); it != extra_kwargs.end(); ++it) vars[it.key()] = it.value();
  return render_variables(vars);
}

ChatTemplateSource load_chat_template(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  ChatTemplateSource out;
  FATHOM_CHECK(fs::exists(path), path.string(), ": no such file or directory");
  if (fs::is_directory(path)) {
    fs::path cfg_path = path / "tokenizer_config.json", jinja = path / "chat_template.jinja";
    nlohmann::ordered_json cfg;
    if (fs::exists(cfg_path)) {
      cfg = parse_json_file(cfg_path);
      out.special_tokens = special_tokens_from_config(cfg);
    }
    if (fs::exists(jinja)) {
      out.source = read_file(jinja);
    } else {
      FATHOM_CHECK(fs::exists(cfg_path), path.string(), ": no chat_template.jinja or tokenizer_config.json");
      out.source = template_from_config(cfg, cfg_path.string());
    }
    return out;
  }
  if (path.extension() == ".json") {
    auto cfg = parse_json_file(path);
    out.special_tokens = special_tokens_from_config(cfg);
    out.source = template_from_config(cfg, path.string());
    return out;
  }
  out.source = read_file(path);
  fs::path cfg_path = path.parent_path() / "tokenizer_config.json";
  if (fs::exists(cfg_path)) out.special_tokens = special_tokens_from_config(parse_json_file(cfg_path));
  return out;
}

}  // namespace fathom::chat
