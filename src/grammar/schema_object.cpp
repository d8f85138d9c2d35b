// Objects: properties in declaration order, then extra keys (patternProperties,
// additionalProperties) that never repeat a declared name, with the property-count keywords.
// Keys appear in declaration order only (as in llguidance and XGrammar): users order fields
// (reasoning before the answer), and any order of n keys would take 2^n rules.
#include <algorithm>
#include <optional>
#include <regex>

#include "core/error.h"
#include "grammar/key_automaton.h"
#include "grammar/schema_compiler.h"

namespace fathom::grammar::schema {

namespace {

bool may_match(const std::string& key, const std::string& pattern) {
  try {
    return std::regex_search(key, std::regex(pattern, std::regex::ECMAScript));
  } catch (const std::regex_error&) {
    return true;
  }
}

Json all_of(const Json& x, const Json& y) {
  if (y.is_boolean() && y.get<bool>()) return x;
  if (x.is_boolean() && x.get<bool>()) return y;
  return Json{{"allOf", Json::array({x, y})}};
}

// The characters of generated extra keys (no escapes, so a key's text is its value).
ByteSet key_chars() {
  ByteSet s;
  s.set_range('a', 'z'), s.set_range('A', 'Z'), s.set_range('0', '9'), s.set('_'), s.set('-');
  return s;
}

// A non-negative count keyword (clamped: no object has 10^5 properties).
int count_of(const Json& s, const char* key, const std::string& path, int dflt) {
  if (!s.contains(key)) return dflt;
  if (!s[key].is_number() || s[key].get<double>() < 0) refuse(key, path, "must be a non-negative integer");
  return static_cast<int>(std::min<double>(s[key].get<double>(), 100000));
}

// dependentRequired / dependentSchemas triggers compiled exactly (2^n object alternatives).
constexpr size_t kMaxTriggers = 3;

struct Prop {
  std::string key;
  Json owned;           // a schema made here (with patternProperties), or
  const Json* schema;   // the document's own
  bool required;
};

}  // namespace

// A JSON string of key characters other than the given names (a trie complement).
static Expr key_not_in(SchemaCompiler& c, const std::vector<std::string>& names) {
  struct Node {
    std::map<uint8_t, size_t> kids;
    bool end = false;
  };
  std::vector<Node> trie(1);
  ByteSet chars = key_chars();
  for (const auto& n : names) {
    if (!std::all_of(n.begin(), n.end(), [&](char ch) { return chars.test(static_cast<uint8_t>(ch)); })) continue;
    size_t at = 0;
    for (char ch : n) {
      auto it = trie[at].kids.find(static_cast<uint8_t>(ch));
      if (it == trie[at].kids.end()) {
        trie.push_back({});
        it = trie[at].kids.emplace(static_cast<uint8_t>(ch), trie.size() - 1).first;
      }
      at = it->second;
    }
    trie[at].end = true;
  }
  Expr free = c.as_rule("keyfree", Expr::seq({Expr::repeat(Expr::byte_set(chars), 0, -1), Expr::literal("\"")}));
  std::vector<uint32_t> ids;
  for (size_t i = 0; i < trie.size(); ++i) ids.push_back(c.new_rule("key"));
  for (size_t i = 0; i < trie.size(); ++i) {
    std::vector<Expr> alts;
    if (!trie[i].end && i != 0) alts.push_back(Expr::literal("\""));
    ByteSet rest = chars;
    for (auto& [b, kid] : trie[i].kids) {
      rest.w[b >> 6] &= ~(uint64_t{1} << (b & 63));
      alts.push_back(Expr::seq({Expr::byte_set(ByteSet::of(b)), Expr::ref(ids[kid])}));
    }
    if (!rest.empty()) alts.push_back(Expr::seq({Expr::byte_set(rest), free}));
    c.define(ids[i], Expr::alt(std::move(alts)));
  }
  return Expr::seq({Expr::literal("\""), Expr::ref(ids[0])});
}

// Extra keys from a product automaton of the patterns and the names (key_automaton.h): a key
// with the schemas of every pattern it matches, or `other`'s where it matches none, never a
// declared name. Only where the rules below would lose keys (patterns that overlap each other
// or a name, a pattern forbidding its keys, additionalProperties beside patterns); nullopt where
// the automaton is out of bounds.
static std::optional<std::vector<Expr>> exact_extras(SchemaCompiler& c, const Json& pp, const Json* other,
                                                     const std::vector<std::string>& names, const std::string& path) {
  bool lossy = pp.size() > 1 || other;
  for (auto& [p, ps] : pp.items()) {
    lossy |= ps == Json(false);
    for (const auto& n : names) lossy |= may_match(n, p);
  }
  if (!lossy) return std::nullopt;
  std::vector<std::string> regexes;
  std::vector<Json> schemas;
  uint64_t forbidden = 0;
  for (auto& [p, ps] : pp.items()) {
    if (ps == Json(false)) forbidden |= uint64_t{1} << regexes.size();
    regexes.push_back(search_regex(p, false));
    schemas.push_back(ps);
  }
  RuleSink rules{[&] { return c.new_rule("key"); }, [&](uint32_t r, Expr e) { c.define(r, std::move(e)); }};
  auto classes = key_classes(regexes, names, other != nullptr, forbidden, rules);
  if (!classes) return std::nullopt;
  std::vector<Expr> extra_alts;
  for (KeyClass& kc : *classes) {
    Json value = kc.patterns ? Json(true) : *other;
    for (size_t i = 0; i < schemas.size(); ++i)
      if (kc.patterns >> i & 1) value = all_of(value, schemas[i]);
    const std::string at = kc.patterns ? path + "/patternProperties" : path + "/additionalProperties";
    extra_alts.push_back(Expr::seq({std::move(kc.key), Expr::literal(":"), SchemaCompiler::sp(), c.as_rule("pval", c.compile(value, at))}));
  }
  return extra_alts;
}

// Extra keys: one per pattern whose language cannot hit a declared name; or, where other keys
// are allowed (`other`: additionalProperties, or true where it is absent and objects are open),
// key-character strings outside the declared names.
static std::vector<Expr> object_extras(SchemaCompiler& c, const Json& s, const Json& pn, const Json* other,
                                       const std::vector<std::string>& names, const std::string& path) {
  const Json pp = s.value("patternProperties", Json::object());
  auto sp = SchemaCompiler::sp;
  std::vector<Expr> extra_alts;
  Json all_pp = true;
  bool pp_false = false;  // a pattern forbidding its keys: no pattern extras (a subset)
  for (auto& [p, ps] : pp.items()) all_pp = all_of(all_pp, ps), pp_false |= ps == Json(false);
  if (pn == Json(true) && !pp.empty()) {
    if (auto exact = exact_extras(c, pp, other, names, path)) return std::move(*exact);
  }
  if (pn == Json(true) && !pp_false) {
    for (auto& [p, ps] : pp.items()) {
      bool hits = false;
      for (const auto& n : names) hits |= may_match(n, p);
      if (!hits)
        extra_alts.push_back(Expr::seq({c.pattern_string(p, path + "/patternProperties", false), Expr::literal(":"), sp(),
                                        c.as_rule("pval", c.compile(all_pp, path + "/patternProperties"))}));
    }
  }
  if (other && pp.empty() && pn != Json(false)) {  // (propertyNames false: no key at all)
    Expr value = c.as_rule("extra", c.compile(*other, path + "/additionalProperties"));
    if (pn == Json(true)) {
      extra_alts.push_back(Expr::seq({key_not_in(c, names), Expr::literal(":"), sp(), value}));
    } else if (pn.is_object() && (pn.contains("enum") || pn.contains("const"))) {
      Json vals = pn.contains("const") ? Json::array({pn["const"]}) : pn["enum"];
      std::vector<Expr> keys;
      for (const Json& v : vals)
        if (v.is_string() && std::find(names.begin(), names.end(), v.get<std::string>()) == names.end() &&
            value_satisfies(v, without(pn, {"enum", "const"})))
          keys.push_back(Expr::literal(v.dump()));
      if (!keys.empty()) extra_alts.push_back(Expr::seq({Expr::alt(std::move(keys)), Expr::literal(":"), sp(), value}));
    } else if (names.empty()) {
      Json key_schema = merge(pn, Json{{"type", "string"}}, path + "/propertyNames");  // keys are strings
      extra_alts.push_back(Expr::seq({c.compile(key_schema, path + "/propertyNames"), Expr::literal(":"), sp(), value}));
    }
  }

  return extra_alts;
}

// The members in order: S_i: properties from i on, none written yet; R_i: the same after one
// was written (comma); extra pairs (extra_min to extra_max, -1: unbounded) after the declared.
static Expr object_chain(SchemaCompiler& c, const std::vector<Prop>& props, std::vector<Expr> extra_alts,
                         int extra_min, int extra_max, const std::string& path) {
  auto sp = SchemaCompiler::sp;
  Expr comma = Expr::seq({Expr::literal(","), sp()});
  std::optional<Expr> extra;
  if (!extra_alts.empty()) extra = c.as_rule("pair", Expr::alt(std::move(extra_alts)));
  int rmax = extra_max < 0 ? -1 : extra_max;
  Expr r_next = extra ? Expr::repeat(Expr::seq({comma, *extra}), extra_min, rmax) : Expr::empty();
  Expr s_next = !extra ? Expr::empty()
                : extra_min > 0 ? Expr::seq({*extra, Expr::repeat(Expr::seq({comma, *extra}), 0, rmax < 0 ? -1 : rmax - 1)})
                                : Expr::repeat(Expr::seq({*extra, Expr::repeat(Expr::seq({comma, *extra}), 0, rmax < 0 ? -1 : rmax - 1)}), 0, 1);
  for (size_t i = props.size(); i-- > 0;) {
    const Prop& p = props[i];
    auto value = [&] { return c.compile(p.schema ? *p.schema : p.owned, path + "/properties/" + p.key); };
    // An optional property whose schema has no instance is never written (a required one: the
    // object has none either).
    std::optional<Expr> v = p.required ? std::optional<Expr>(value()) : c.unless_no_instance(value);
    if (!v) continue;
    Expr kv = Expr::seq({Expr::literal(Json(p.key).dump()), Expr::literal(":"), sp(), c.as_rule("prop", std::move(*v))});
    Expr r_rule = c.as_rule("rest", Expr::empty());
    // The comma with and without its space as two alternatives of the rule, not a call of an
    // optional-space rule: the keys a state may go on with then share one parent, so a mask
    // after a comma is one group of positions and one walk, not one per property left.
    Expr with_r = Expr::alt({Expr::seq({Expr::literal(","), kv, r_next}), Expr::seq({Expr::literal(", "), kv, r_next})});
    Expr with_s = Expr::seq({kv, r_next});
    Expr r_i = p.required ? with_r : Expr::alt({with_r, r_next});
    Expr s_i = p.required ? with_s : Expr::alt({with_s, s_next});
    c.define(r_rule.rule, std::move(r_i));
    r_next = std::move(r_rule);
    s_next = c.as_rule("first", std::move(s_i));
  }
  return Expr::seq({Expr::literal("{"), std::move(s_next), Expr::literal("}")});
}

// The object of these properties (and the extra keys) under minProperties / maxProperties.
static Expr object_with_counts(SchemaCompiler& c, std::vector<Prop> props, const Json& s, const Json& pn,
                               const Json* extra_schema, const std::vector<std::string>& names, const std::string& path) {
  const Json pp = s.value("patternProperties", Json::object());
  std::vector<Expr> extra_alts = object_extras(c, s, pn, extra_schema, names, path);

  // Property counts: optional properties promoted (minProperties) or left out (maxProperties).
  int n_req = 0;
  for (auto& p : props) n_req += p.required;
  int min_p = count_of(s, "minProperties", path, 0), max_p = count_of(s, "maxProperties", path, -1);
  for (auto& p : props)
    if (!p.required && n_req < min_p) p.required = true, ++n_req;
  if (max_p >= 0 && n_req > max_p) no_instance("maxProperties", path, "fewer than the required properties");
  if (max_p >= 0) {
    int kept = n_req;
    std::vector<Prop> out;
    for (auto& p : props)
      if (p.required || kept < max_p) kept += !p.required, out.push_back(p);
    props = out;
  }
  int n_all = static_cast<int>(props.size());
  int extra_min = std::max(0, min_p - n_all);
  int extra_max = extra_alts.empty() ? 0 : max_p < 0 ? -1 : max_p - n_all;
  // Absent additionalProperties allows any other key: used when minProperties needs one.
  if (extra_min > 0 && extra_alts.empty() && !s.contains("additionalProperties") && pp.empty() &&
      !s.contains("unevaluatedProperties") && pn == Json(true)) {
    extra_alts.push_back(Expr::seq({key_not_in(c, names), Expr::literal(":"), SchemaCompiler::sp(), Expr::ref(c.common("value"))}));
    extra_max = max_p < 0 ? -1 : max_p - n_all;
  }
  if (extra_max == 0) extra_alts.clear();
  if (extra_min > 1 || (extra_min > 0 && extra_alts.empty()))
    c.unsupported("minProperties", path, "needs more properties than declared (or than maxProperties allows)"),
        extra_min = 0;

  return object_chain(c, props, std::move(extra_alts), extra_min, extra_max, path);
}

// dependentRequired on an optional property: the object with the trigger (and its dependencies
// required) or without it, as alternatives for up to kMaxTriggers triggers; past that the
// dependencies become required (a subset). A trigger whose dependency cannot be written is left
// out. Each combination is an object under the property counts.
static Expr object_with_triggers(SchemaCompiler& c, std::vector<Prop> props, const Json& dep_required, const Json& s,
                                 const Json& pn, const Json* extra_schema, const std::vector<std::string>& names,
                                 const std::string& path) {
  auto find = [&](const std::string& k) {
    return std::find_if(props.begin(), props.end(), [&](const Prop& p) { return p.key == k; });
  };
  auto deps_of = [](const Json& deps) {
    std::vector<std::string> out;
    for (const Json& d : deps) out.push_back(d.get<std::string>());
    return out;
  };
  // Left out until none is (a trigger left out may be another one's dependency).
  for (bool erased = true; erased;) {
    erased = false;
    for (auto& [key, deps] : dep_required.items()) {
      auto trigger = find(key);
      if (trigger == props.end() || trigger->required) continue;
      const std::vector<std::string> names_of_deps = deps_of(deps);
      if (!std::all_of(names_of_deps.begin(), names_of_deps.end(), [&](const std::string& d) { return find(d) != props.end(); }))
        props.erase(trigger), erased = true;
    }
  }
  std::vector<std::pair<std::string, std::vector<std::string>>> triggers;
  for (auto& [key, deps] : dep_required.items())
    if (auto trigger = find(key); trigger != props.end() && !trigger->required) triggers.emplace_back(key, deps_of(deps));
  const size_t n_variants = triggers.size() <= kMaxTriggers ? size_t{1} << triggers.size() : 1;
  std::vector<Expr> variants;
  std::optional<Error> last;
  for (size_t v = 0; v < n_variants; ++v) {
    auto with = [&](size_t t) { return n_variants == 1 || ((v >> t) & 1); };
    // A combination that leaves out a trigger another one there depends on has no instance.
    bool consistent = true;
    for (size_t t = 0; t < triggers.size(); ++t)
      for (size_t u = 0; u < triggers.size(); ++u)
        if (with(t) && !with(u) && std::count(triggers[t].second.begin(), triggers[t].second.end(), triggers[u].first))
          consistent = false;
    if (!consistent) continue;
    std::vector<Prop> these = props;
    for (size_t t = 0; t < triggers.size(); ++t) {
      const std::string& key = triggers[t].first;  // (a structured binding cannot be captured in clang)
      const std::vector<std::string>& deps = triggers[t].second;
      if (!with(t)) {
        these.erase(std::find_if(these.begin(), these.end(), [&](const Prop& p) { return p.key == key; }));
        continue;
      }
      for (auto& q : these) q.required |= (n_variants > 1 && q.key == key) || std::find(deps.begin(), deps.end(), q.key) != deps.end();
    }
    try {
      variants.push_back(object_with_counts(c, std::move(these), s, pn, extra_schema, names, path));
    } catch (const Error& e) {
      if (n_variants == 1) throw;
      last = e;  // e.g. more required properties than maxProperties: no instance has them
    }
  }
  if (variants.empty()) throw *last;  // (the variant without any trigger is always consistent)
  return variants.size() == 1 ? std::move(variants[0]) : Expr::alt(std::move(variants));
}

// dependentSchemas: for up to kMaxTriggers triggers, the object without each trigger or with it
// (required) and its schema merged in, as alternatives; past that each schema applies
// unconditionally (a subset), or its trigger is left out where the merge is impossible.
Expr SchemaCompiler::compile_dependent_schemas(const Json& s, const std::string& path) {
  const Json deps = s["dependentSchemas"];
  const Json base = without(s, {"dependentSchemas"});
  if (deps.size() > kMaxTriggers) {
    Json merged = base;
    for (auto& [k, d] : deps.items()) {
      try {
        merged = merge(merged, flatten(norm(d, path), path), path);
      } catch (const Error&) {
        merged["properties"][k] = false;
      }
    }
    return compile_resolved(merged, path, 1);
  }
  std::vector<Expr> variants;
  std::optional<Error> last;
  for (size_t v = 0; v < (size_t{1} << deps.size()); ++v) {
    try {
      Json merged = base;
      size_t t = 0;
      for (auto& [k, d] : deps.items()) {
        if ((v >> t++) & 1) {
          merged = merge(merged, flatten(norm(d, path), path), path);
          merged = merge(merged, Json{{"required", Json::array({k})}}, path);
        } else {
          merged["properties"][k] = false;
        }
      }
      variants.push_back(compile_resolved(merged, path, 1));
    } catch (const Error& e) {
      last = e;  // this combination has no instance
    }
  }
  if (variants.empty()) throw *last;
  return variants.size() == 1 ? std::move(variants[0]) : Expr::alt(std::move(variants));
}

// (Subschemas are referenced, not copied: large documents nest deeply.)
Expr SchemaCompiler::compile_object(const Json& s, const std::string& path) {
  if (s.contains("dependentSchemas")) return compile_dependent_schemas(s, path);
  const Json pp = s.value("patternProperties", Json::object());
  const bool has_ap = s.contains("additionalProperties") && s["additionalProperties"] != Json(false);
  const Json ap = has_ap ? s["additionalProperties"] : Json(false);
  const bool closed = s.contains("additionalProperties") && !has_ap;
  // The schema of keys outside properties and patterns, when they may be written.
  const bool declares_keys = has_any(s, {"properties", "required", "dependentRequired", "dependentSchemas"});
  const bool open = objects_open(declares_keys) && !s.contains("additionalProperties") &&
                    !s.contains("unevaluatedProperties");
  const Json other = has_ap ? ap : Json(true);
  const Json* extra_schema = has_ap || open ? &other : nullptr;
  const Json pn = s.contains("propertyNames") ? flatten(norm(s["propertyNames"], path), path) : Json(true);
  static const Json kNoProperties = Json::object();
  const Json& declared = s.contains("properties") ? s["properties"] : kNoProperties;
  const Json required_list = s.value("required", Json::array());
  const Json dep_required = s.value("dependentRequired", Json::object());
  std::vector<std::string> required;
  for (const Json& k : required_list)
    if (k.is_string() && std::find(required.begin(), required.end(), k.get<std::string>()) == required.end())
      required.push_back(k.get<std::string>());
  // Dependencies of required names are required, and theirs in turn (to a fixpoint).
  for (bool grew = true; grew;) {
    grew = false;
    for (auto& [k, deps] : dep_required.items())
      if (std::find(required.begin(), required.end(), k) != required.end())
        for (const Json& d : deps)
          if (std::find(required.begin(), required.end(), d.get<std::string>()) == required.end())
            required.push_back(d.get<std::string>()), grew = true;
  }

  // Declared properties (and required-but-undeclared ones) with the schemas that apply to them.
  std::vector<Prop> props;
  std::vector<std::string> names;  // every name that extra keys must avoid
  auto with_patterns = [&](const std::string& k, Json v) {
    for (auto& [p, ps] : pp.items())
      if (may_match(k, p)) v = ps == Json(false) ? Json(false) : all_of(v, ps);
    return v;
  };
  for (auto& [k, v] : declared.items()) {
    names.push_back(k);
    bool req = std::find(required.begin(), required.end(), k) != required.end();
    bool ok_name = pn == Json(true) || value_satisfies(Json(k), pn);
    Json merged = pp.empty() ? Json(true) : with_patterns(k, v);
    if (v == Json(false) || merged == Json(false) || !ok_name) {
      if (req) no_instance(ok_name ? "properties" : "propertyNames", path, "required property '" + k + "' is not allowed");
      continue;
    }
    if (pp.empty()) props.push_back({k, Json(), &v, req});
    else props.push_back({k, std::move(merged), nullptr, req});
  }
  for (const auto& k : required) {
    if (std::find(names.begin(), names.end(), k) != names.end()) continue;
    names.push_back(k);
    bool matched = false;
    for (auto& [p, ps] : pp.items()) matched |= may_match(k, p);
    if (!matched && closed) no_instance("required", path, "'" + k + "' is required but additionalProperties is false");
    if (pn != Json(true) && !value_satisfies(Json(k), pn)) no_instance("propertyNames", path, "required '" + k + "' is not allowed");
    Json v = matched ? with_patterns(k, true) : has_ap ? ap : s.value("unevaluatedProperties", Json(true));
    if (v == Json(false)) no_instance("unevaluatedProperties", path, "required '" + k + "' is not allowed");
    props.push_back({k, v, nullptr, true});
  }
  // Names of dependentRequired that are not declared are never extra keys: where other keys are
  // allowed they become optional properties (dependencies first, so a trigger may follow them).
  for (auto& [key, deps] : dep_required.items()) {
    std::vector<std::string> group;
    for (const Json& d : deps) group.push_back(d.get<std::string>());
    group.push_back(key);
    for (const auto& k : group) {
      if (std::find(names.begin(), names.end(), k) != names.end()) continue;
      names.push_back(k);
      bool matched = false;
      for (auto& [p, ps] : pp.items()) matched |= may_match(k, p);
      // (Free-form objects take them too: they are names the schema declares.)
      const bool writable = !closed && !s.contains("unevaluatedProperties") && objects_open(false);
      Json v = matched ? with_patterns(k, true) : extra_schema ? *extra_schema : Json(writable);
      if (v != Json(false) && (pn == Json(true) || value_satisfies(Json(k), pn))) props.push_back({k, v, nullptr, false});
    }
  }
  return object_with_triggers(*this, std::move(props), dep_required, s, pn, extra_schema, names, path);
}

}  // namespace fathom::grammar::schema
