#include "grammar/json_schema.h"

#include <map>
#include <optional>
#include <set>

#include "core/error.h"
#include "grammar/regex.h"

namespace fathom::grammar {

namespace {

using Json = nlohmann::ordered_json;

const std::set<std::string> kSupported = {"type", "properties", "required", "additionalProperties", "enum",
                                          "const", "items", "minItems", "maxItems", "anyOf", "oneOf",
                                          "pattern", "minLength", "maxLength", "$ref", "$defs", "definitions"};
const std::set<std::string> kAnnotations = {"title", "description", "default", "examples", "$schema", "$id",
                                            "$comment", "deprecated", "readOnly", "writeOnly"};

Expr sp() { return Expr::repeat(Expr::literal(" "), 0, 1); }

class SchemaCompiler {
 public:
  explicit SchemaCompiler(const Json& root) : root_(root) {}

  std::shared_ptr<const Grammar> run() {
    uint32_t r = b_.rule("root");
    b_.define(r, compile(root_, "#"));
    return Grammar::build(b_, "root");
  }

  std::shared_ptr<const Grammar> any_object() {
    uint32_t r = b_.rule("root");
    b_.define(r, Expr::ref(common("object")));
    return Grammar::build(b_, "root");
  }

 private:
  // Shared rules (one set of grammar positions, so one token cache entry each).
  uint32_t common(const std::string& name) {
    if (b_.has_rule(name)) return b_.rule(name);
    uint32_t r = b_.rule(name);
    Expr body;
    if (name == "string") {
      body = Expr::seq({Expr::literal("\""), Expr::ref(common("strbody"))});
    } else if (name == "strbody") {
      // Each character alternative is followed by a tail call, and the closing quote ends the
      // rule: string content keeps one stack node, and most tokens are context-independent.
      std::vector<Expr> alts;
      for (Expr& a : char_alternatives()) alts.push_back(Expr::seq({std::move(a), Expr::ref(r)}));
      alts.push_back(Expr::literal("\""));
      body = Expr::alt(std::move(alts));
    } else if (name == "integer") {
      body = Expr::seq({Expr::repeat(Expr::literal("-"), 0, 1), Expr::alt({Expr::literal("0"), Expr::seq({digits(1, 9), Expr::repeat(digits(0, 9), 0, -1)})})});
    } else if (name == "number") {
      Expr frac = Expr::repeat(Expr::seq({Expr::literal("."), Expr::repeat(digits(0, 9), 1, -1)}), 0, 1);
      ByteSet e, sign;
      e.set('e'), e.set('E'), sign.set('-'), sign.set('+');
      Expr exp = Expr::repeat(Expr::seq({Expr::byte_set(e), Expr::repeat(Expr::byte_set(sign), 0, 1),
                                         Expr::repeat(digits(0, 9), 1, -1)}),
                              0, 1);
      body = Expr::seq({Expr::ref(common("integer")), std::move(frac), std::move(exp)});
    } else if (name == "boolean") {
      body = Expr::alt({Expr::literal("true"), Expr::literal("false")});
    } else if (name == "null") {
      body = Expr::literal("null");
    } else if (name == "value") {
      std::vector<Expr> alts;
      for (const char* k : {"object", "array", "string", "number", "boolean", "null"})
        alts.push_back(Expr::ref(common(k)));
      body = Expr::alt(std::move(alts));
    } else if (name == "object") {
      Expr pair = Expr::ref(common("pair"));
      body = Expr::seq({Expr::literal("{"), Expr::repeat(Expr::seq({pair, Expr::repeat(Expr::seq({Expr::literal(","), sp(), pair}), 0, -1)}), 0, 1), Expr::literal("}")});
    } else if (name == "pair") {
      body = Expr::seq({Expr::ref(common("string")), Expr::literal(":"), sp(), Expr::ref(common("value"))});
    } else if (name == "array") {
      body = list("[", Expr::ref(common("value")), 0, -1, "]");
    }
    b_.define(r, std::move(body));
    return r;
  }

  static Expr digits(char lo, char hi) {
    ByteSet s;
    s.set_range(static_cast<uint8_t>('0' + lo), static_cast<uint8_t>('0' + hi));
    return Expr::byte_set(s);
  }

  // One JSON string character: a safe code point or an escape.
  static std::vector<Expr> char_alternatives() {
    Expr cls = codepoint_class(complement_ranges({{0, 0x1F}, {'"', '"'}, {'\\', '\\'}}));
    std::vector<Expr> alts = cls.kind == Expr::Kind::Alt ? cls.kids : std::vector<Expr>{cls};
    ByteSet esc;
    for (char c : std::string("\"\\/bfnrt")) esc.set(static_cast<uint8_t>(c));
    alts.push_back(Expr::seq({Expr::literal("\\"), Expr::byte_set(esc)}));
    ByteSet hex, hex_no_d;
    for (char c : std::string("0123456789abcdefABCDEF")) hex.set(static_cast<uint8_t>(c));
    hex_no_d = hex;
    hex_no_d.w['d' >> 6] &= ~(uint64_t{1} << ('d' & 63));
    hex_no_d.w['D' >> 6] &= ~(uint64_t{1} << ('D' & 63));
    alts.push_back(Expr::seq({Expr::literal("\\u"), Expr::byte_set(hex_no_d), Expr::byte_set(hex),
                              Expr::byte_set(hex), Expr::byte_set(hex)}));
    return alts;
  }

  // open item ("," item){min-1,max-1} close, or open close when min == 0 allows it.
  static Expr list(const char* open, Expr item, int min, int max, const char* close) {
    Expr more = Expr::seq({Expr::literal(","), sp(), item});
    int rest_min = std::max(min - 1, 0), rest_max = max < 0 ? -1 : max - 1;
    Expr body = Expr::seq({item, Expr::repeat(more, rest_min, rest_max)});
    if (min == 0) body = Expr::repeat(std::move(body), 0, 1);
    if (max == 0) body = Expr::empty();
    return Expr::seq({Expr::literal(open), std::move(body), Expr::literal(close)});
  }

  static int count(const Json& s, const char* key, const std::string& path, int dflt) {
    if (!s.contains(key)) return dflt;
    const Json& v = s[key];
    FATHOM_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() <= 100000,
                 "json schema: '", key, "' at ", path, " must be a non-negative integer (at most 100000)");
    return v.get<int>();
  }

  Expr literal_value(const Json& v) { return Expr::literal(v.dump()); }

  uint32_t new_rule(const std::string& hint) { return b_.rule(hint + "-" + std::to_string(counter_++)); }

  // A rule holding `e` (so that large subexpressions are referenced, not copied).
  Expr as_rule(const std::string& hint, Expr e) {
    uint32_t r = new_rule(hint);
    b_.define(r, std::move(e));
    return Expr::ref(r);
  }

  Expr compile(const Json& s, const std::string& path);
  Expr compile_ref(const std::string& ref, const std::string& path);
  Expr compile_type(const std::string& type, const Json& s, const std::string& path);
  Expr compile_string(const Json& s, const std::string& path);
  Expr compile_object(const Json& s, const std::string& path);

  const Json& root_;
  GrammarBuilder b_;
  std::map<std::string, uint32_t> refs_;
  int counter_ = 0;
};

Expr SchemaCompiler::compile(const Json& s, const std::string& path) {
  if (s.is_boolean()) {
    FATHOM_CHECK(s.get<bool>(), "json schema: 'false' schema at ", path, " is not supported");
    return Expr::ref(common("value"));
  }
  FATHOM_CHECK(s.is_object(), "json schema: schema at ", path, " must be an object or a boolean");
  std::vector<std::string> active;
  for (auto& [k, v] : s.items()) {
    if (kAnnotations.count(k)) continue;
    if (!kSupported.count(k)) fail("json schema: unsupported keyword '", k, "' at ", path);
    if (k != "$defs" && k != "definitions") active.push_back(k);
  }
  if (s.contains("$ref")) {
    FATHOM_CHECK(active.size() == 1, "json schema: keywords beside '$ref' at ", path, " are not supported");
    FATHOM_CHECK(s["$ref"].is_string(), "json schema: '$ref' at ", path, " must be a string");
    return compile_ref(s["$ref"].get<std::string>(), path);
  }
  for (const char* comb : {"anyOf", "oneOf"}) {
    if (!s.contains(comb)) continue;
    FATHOM_CHECK(active.size() == 1, "json schema: keywords beside '", comb, "' at ", path, " are not supported");
    const Json& list = s[comb];
    FATHOM_CHECK(list.is_array() && !list.empty(), "json schema: '", comb, "' at ", path, " must be a non-empty array");
    std::vector<Expr> alts;
    for (size_t i = 0; i < list.size(); ++i)
      alts.push_back(compile(list[i], path + "/" + comb + "/" + std::to_string(i)));
    return Expr::alt(std::move(alts));
  }
  if (s.contains("const")) return literal_value(s["const"]);
  if (s.contains("enum")) {
    const Json& list = s["enum"];
    FATHOM_CHECK(list.is_array() && !list.empty(), "json schema: 'enum' at ", path, " must be a non-empty array");
    std::vector<Expr> alts;
    for (const Json& v : list) alts.push_back(literal_value(v));
    return Expr::alt(std::move(alts));
  }
  std::vector<std::string> types;
  if (s.contains("type")) {
    const Json& t = s["type"];
    if (t.is_string()) types.push_back(t.get<std::string>());
    else if (t.is_array())
      for (const Json& x : t) {
        FATHOM_CHECK(x.is_string(), "json schema: 'type' at ", path, " must be a string or a list of strings");
        types.push_back(x.get<std::string>());
      }
    FATHOM_CHECK(!types.empty(), "json schema: 'type' at ", path, " must be a string or a non-empty list");
  } else if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties")) {
    types.push_back("object");
  } else if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) {
    types.push_back("array");
  } else if (s.contains("pattern") || s.contains("minLength") || s.contains("maxLength")) {
    types.push_back("string");
  } else {
    return Expr::ref(common("value"));
  }
  std::vector<Expr> alts;
  for (const auto& t : types) alts.push_back(compile_type(t, s, path));
  return Expr::alt(std::move(alts));
}

Expr SchemaCompiler::compile_ref(const std::string& ref, const std::string& path) {
  FATHOM_CHECK(!ref.empty() && ref[0] == '#', "json schema: only local '$ref' (#...) is supported, got '", ref,
               "' at ", path);
  if (auto it = refs_.find(ref); it != refs_.end()) return Expr::ref(it->second);
  const Json* target = &root_;
  size_t i = 1;
  while (i < ref.size()) {
    FATHOM_CHECK(ref[i] == '/', "json schema: bad '$ref' '", ref, "' at ", path);
    size_t j = ref.find('/', i + 1);
    if (j == std::string::npos) j = ref.size();
    std::string key = ref.substr(i + 1, j - i - 1);
    for (size_t k; (k = key.find("~1")) != std::string::npos;) key.replace(k, 2, "/");
    for (size_t k; (k = key.find("~0")) != std::string::npos;) key.replace(k, 2, "~");
    FATHOM_CHECK(target->is_object() && target->contains(key), "json schema: '$ref' '", ref, "' at ", path,
                 " points nowhere");
    target = &(*target)[key];
    i = j;
  }
  uint32_t r = new_rule("ref");
  refs_[ref] = r;  // before compiling the target, so that recursion refers to this rule
  b_.define(r, compile(*target, ref));
  return Expr::ref(r);
}

Expr SchemaCompiler::compile_type(const std::string& type, const Json& s, const std::string& path) {
  if (type == "null" || type == "boolean" || type == "integer" || type == "number") return Expr::ref(common(type));
  if (type == "string") return compile_string(s, path);
  if (type == "object") return compile_object(s, path);
  if (type == "array") {
    Expr item = s.contains("items") ? as_rule("item", compile(s["items"], path + "/items")) : Expr::ref(common("value"));
    int min = count(s, "minItems", path, 0), max = count(s, "maxItems", path, -1);
    FATHOM_CHECK(max < 0 || max >= min, "json schema: maxItems < minItems at ", path);
    return list("[", std::move(item), min, max, "]");
  }
  fail("json schema: unsupported type '", type, "' at ", path);
}

Expr SchemaCompiler::compile_string(const Json& s, const std::string& path) {
  int min = count(s, "minLength", path, 0), max = count(s, "maxLength", path, -1);
  FATHOM_CHECK(max < 0 || max >= min, "json schema: maxLength < minLength at ", path);
  if (s.contains("pattern")) {
    FATHOM_CHECK(s["pattern"].is_string(), "json schema: 'pattern' at ", path, " must be a string");
    FATHOM_CHECK(min == 0 && max < 0, "json schema: 'pattern' with minLength/maxLength at ", path,
                 " is not supported");
    Expr body;
    try {
      body = regex_to_expr(s["pattern"].get<std::string>(), RegexOptions{true});
    } catch (const Error& e) {
      fail("json schema: 'pattern' at ", path, ": ", e.what());
    }
    return Expr::seq({Expr::literal("\""), as_rule("pattern", std::move(body)), Expr::literal("\"")});
  }
  if (min == 0 && max < 0) return Expr::ref(common("string"));
  return Expr::seq({Expr::literal("\""), Expr::repeat(Expr::alt(char_alternatives()), min, max), Expr::literal("\"")});
}

Expr SchemaCompiler::compile_object(const Json& s, const std::string& path) {
  std::vector<std::pair<std::string, const Json*>> props;
  static const Json kAny = Json::object();
  if (s.contains("properties")) {
    FATHOM_CHECK(s["properties"].is_object(), "json schema: 'properties' at ", path, " must be an object");
    for (auto& [k, v] : s["properties"].items()) props.push_back({k, &v});
  }
  std::set<std::string> required;
  if (s.contains("required")) {
    FATHOM_CHECK(s["required"].is_array(), "json schema: 'required' at ", path, " must be an array");
    for (const Json& k : s["required"]) {
      FATHOM_CHECK(k.is_string(), "json schema: 'required' at ", path, " must list strings");
      required.insert(k.get<std::string>());
    }
  }
  for (const auto& k : required) {  // required but undeclared: any value
    bool declared = false;
    for (auto& p : props) declared |= p.first == k;
    if (!declared) props.push_back({k, &kAny});
  }
  std::optional<Expr> extra;  // one additional "key": value pair
  if (s.contains("additionalProperties") && !(s["additionalProperties"].is_boolean() && !s["additionalProperties"].get<bool>())) {
    Expr value = compile(s["additionalProperties"], path + "/additionalProperties");
    extra = as_rule("extra", Expr::seq({Expr::ref(common("string")), Expr::literal(":"), sp(), std::move(value)}));
  }
  // S_i: properties from i on, none written yet; R_i: the same after one was written (comma).
  Expr comma = Expr::seq({Expr::literal(","), sp()});
  Expr r_next = extra ? Expr::repeat(Expr::seq({comma, *extra}), 0, -1) : Expr::empty();
  Expr s_next = extra ? Expr::repeat(Expr::seq({*extra, r_next}), 0, 1) : Expr::empty();
  for (size_t i = props.size(); i-- > 0;) {
    const auto& [key, sub] = props[i];
    Expr kv = Expr::seq({Expr::literal(Json(key).dump()), Expr::literal(":"), sp(),
                         as_rule("prop", compile(*sub, path + "/properties/" + key))});
    Expr r_rule = as_rule("rest", Expr::empty());
    Expr with_r = Expr::seq({comma, kv, r_next});
    Expr with_s = Expr::seq({kv, r_next});
    bool req = required.count(key) > 0;
    Expr r_i = req ? with_r : Expr::alt({with_r, r_next});
    Expr s_i = req ? with_s : Expr::alt({with_s, s_next});
    b_.define(r_rule.rule, std::move(r_i));
    r_next = std::move(r_rule);
    s_next = as_rule("first", std::move(s_i));
  }
  return Expr::seq({Expr::literal("{"), std::move(s_next), Expr::literal("}")});
}

}  // namespace

std::shared_ptr<const Grammar> grammar_from_json_schema_json(const nlohmann::ordered_json& schema) {
  return SchemaCompiler(schema).run();
}

std::shared_ptr<const Grammar> grammar_from_json_schema(std::string_view schema_text) {
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(schema_text);
  } catch (const nlohmann::json::exception& e) {
    fail("json schema: invalid JSON: ", e.what());
  }
  return grammar_from_json_schema_json(j);
}

std::shared_ptr<const Grammar> json_object_grammar() {
  static const Json kEmpty = Json::object();
  return SchemaCompiler(kEmpty).any_object();
}

}  // namespace fathom::grammar
