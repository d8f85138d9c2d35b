// JSON Schema to grammar: dispatch, $ref, allOf/anyOf/oneOf, if/then/else, not, enum/const.
#include "grammar/json_schema.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <optional>

#include "core/error.h"
#include "grammar/schema_compiler.h"

namespace fathom::grammar {

namespace schema {

namespace {

constexpr int kMaxDepth = 64;  // nested $ref/allOf inlining (a $ref cycle without a value in between)


// The instances that fail `s` when `s` is a single bound on numbers or on string lengths: the
// values of that type past the bound (values of other types pass the keyword, so never fail it).
std::optional<Json> failing_bound(const Json& s) {
  if (!s.is_object() || s.size() != 1 || !s.begin().value().is_number()) return std::nullopt;
  const std::string k = s.begin().key();
  const Json& v = s.begin().value();
  if (k == "minimum") return Json{{"type", "number"}, {"exclusiveMaximum", v}};
  if (k == "exclusiveMinimum") return Json{{"type", "number"}, {"maximum", v}};
  if (k == "maximum") return Json{{"type", "number"}, {"exclusiveMinimum", v}};
  if (k == "exclusiveMaximum") return Json{{"type", "number"}, {"minimum", v}};
  const double n = v.get<double>();
  if (k == "maxLength" && n >= 0 && n < 1e5) return Json{{"type", "string"}, {"minLength", int64_t(std::floor(n)) + 1}};
  if (k == "minLength" && n >= 1 && n < 1e5) return Json{{"type", "string"}, {"maxLength", int64_t(std::ceil(n)) - 1}};
  return std::nullopt;
}

// A branch that no instance satisfies, by a shallow look (dropped from anyOf/oneOf/if).
bool unsatisfiable(const Json& s) {
  if (!s.is_object()) return s.is_boolean() && !s.get<bool>();
  if (s.contains("type") && types_of(s).empty()) return true;
  if (s.contains("enum") || s.contains("const")) {
    Json vals = s.contains("const") ? Json::array({s["const"]}) : s["enum"];
    if (s.contains("const") && s.contains("enum") && std::find(s["enum"].begin(), s["enum"].end(), s["const"]) == s["enum"].end())
      return true;
    Json rest = without(s, {"enum", "const"});
    bool any = false;
    for (const Json& v : vals) any |= value_satisfies(v, rest, true);
    if (!any) return true;
  }
  if (s.contains("required") && s.contains("properties"))
    for (const Json& k : s["required"])
      if (k.is_string() && s["properties"].contains(k.get<std::string>()) && s["properties"][k.get<std::string>()] == Json(false))
        return true;
  return false;
}

}  // namespace

SchemaCompiler::SchemaCompiler(const Json& root, const SchemaOptions& opts, SchemaReport* report)
    : doc_(root), opts_(opts), report_(report) {}

std::shared_ptr<const Grammar> SchemaCompiler::run() {
  uint32_t r = b_.rule("root");
  b_.define(r, compile(doc_.root(), "#"));
  return Grammar::build(b_, "root");
}

std::shared_ptr<const Grammar> SchemaCompiler::any_object() {
  uint32_t r = b_.rule("root");
  b_.define(r, Expr::ref(common("object")));
  return Grammar::build(b_, "root");
}

void SchemaCompiler::unsupported(const std::string& keyword, const std::string& path, const std::string& why) {
  if (!opts_.best_effort) refuse(keyword, path, why);
  if (report_) report_->warnings.push_back(keyword + " at " + path + ": " + why);
}

Json SchemaCompiler::flatten(Json s, const std::string& path, int depth) {
  if (depth > kMaxDepth) refuse("$ref", path, "nested too deeply (a cycle of references?)");
  if (s.is_object() && s.contains("$ref")) {
    if (!s["$ref"].is_string()) refuse("$ref", path, "must be a string");
    Json target = norm(doc_.resolve(s["$ref"].get<std::string>(), path), path);
    return flatten(merge(without(s, {"$ref"}), target, path), path, depth + 1);
  }
  if (s.is_object() && s.contains("allOf")) {
    Json list = s["allOf"];
    if (!list.is_array()) refuse("allOf", path, "must be an array");
    s.erase("allOf");
    // Combinators that clash with one already here stay pending in allOf: compile_resolved
    // applies the one at the top first, and the pending ones when its branches are flattened.
    Json pending = Json::array();
    for (size_t i = 0; i < list.size(); ++i) {
      std::string p = path + "/allOf/" + std::to_string(i);
      Json e = flatten(norm(list[i], p), p, depth + 1);
      if (e.is_object()) {
        Json comb = Json::object();
        for (const char* k : {"anyOf", "oneOf", "not", "allOf"})
          if (e.contains(k) && (s.contains(k) || std::string(k) == "allOf")) comb[k] = e[k];
        if (e.contains("if") && s.contains("if"))
          for (const char* k : {"if", "then", "else"})
            if (e.contains(k)) comb[k] = e[k];
        for (auto& [k, v] : comb.items()) e.erase(k);
        if (comb.contains("allOf")) {
          for (const Json& x : comb["allOf"]) pending.push_back(x);
          comb.erase("allOf");
        }
        if (!comb.empty()) pending.push_back(comb);
      }
      s = merge(s, e, path);
    }
    if (s.is_object() && s.contains("allOf"))
      for (const Json& x : s["allOf"]) pending.push_back(x);
    s.erase("allOf");
    // Pending entries wait only beside a combinator at the top; otherwise they move up.
    while (!pending.empty() && !has_any(s, {"anyOf", "oneOf", "not", "if"})) {
      Json first = pending[0];
      pending.erase(pending.begin());
      s = merge(s, first, path);
      if (s.contains("allOf")) {
        for (const Json& x : s["allOf"]) pending.push_back(x);
        s.erase("allOf");
      }
    }
    if (!pending.empty()) s["allOf"] = pending;
  }
  return s;
}

Expr SchemaCompiler::compile(const Json& raw, const std::string& path) {
  if (raw.is_boolean()) {
    if (!raw.get<bool>()) no_instance("false", path, "no instance is valid");
    return Expr::ref(common("value"));
  }
  if (!raw.is_object()) fail("json schema: schema at ", path, " must be an object or a boolean");
  Json s = norm(raw, path);
  // A bare $ref compiles to one rule per target (recursion and sharing); with siblings it is
  // merged into them.
  if (s.contains("$ref") && s.size() == 1 && s["$ref"].is_string())
    return compile_ref(s["$ref"].get<std::string>(), path);
  return compile_resolved(std::move(s), path, 0);
}

Expr SchemaCompiler::compile_ref(const std::string& ref, const std::string& path) {
  // A target compiled with open objects must not serve a closed context (its proofs assume closed).
  const std::string key = (closed_ > 0 ? "!" : "") + ref;
  if (auto it = refs_.find(key); it != refs_.end()) return Expr::ref(it->second);
  const Json& target = doc_.resolve(ref, path);
  uint32_t r = new_rule("ref");
  refs_[key] = r;  // before compiling the target, so that recursion refers to this rule
  try {
    b_.define(r, compile(target, ref));
  } catch (...) {
    refs_.erase(key);  // the next reference meets the same refusal, not an undefined rule
    throw;
  }
  return Expr::ref(r);
}

Expr SchemaCompiler::compile_resolved(Json s, const std::string& path, int depth) {
  if (depth > kMaxDepth) refuse("$ref", path, "nested too deeply");
  for (const char* k : {"$dynamicRef", "$recursiveRef"})
    if (s.contains(k)) unsupported(k, path, "dynamic references are not supported"), s.erase(k);
  s = flatten(std::move(s), path);
  if (s.is_boolean()) return compile(s, path);
  if (s.contains("anyOf")) return compile_combinator(s, "anyOf", path, depth);
  if (s.contains("oneOf")) return compile_combinator(s, "oneOf", path, depth);
  if (s.contains("not")) return compile_not(std::move(s), path, depth);
  if (s.contains("if")) return compile_conditional(s, path, depth);
  if (s.contains("enum") || s.contains("const")) return compile_enum(s, path);
  std::vector<std::string> types;
  bool typed = s.contains("type");
  if (typed) {
    types = types_of(s);
    if (types.empty()) no_instance("type", path, "no type is allowed (an empty list or an allOf without common type)");
  } else {  // the types whose keywords are present (other types stay unconstrained below)
    if (has_any(s, {"properties", "required", "additionalProperties", "patternProperties", "propertyNames",
                    "minProperties", "maxProperties", "dependentRequired", "dependentSchemas", "unevaluatedProperties"}))
      types.push_back("object");
    if (has_any(s, {"items", "prefixItems", "minItems", "maxItems", "contains", "uniqueItems", "unevaluatedItems"}))
      types.push_back("array");
    if (has_any(s, {"pattern", "minLength", "maxLength", "format"})) types.push_back("string");
    if (has_any(s, {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"})) types.push_back("number");
    if (types.empty()) return Expr::ref(common("value"));
  }
  bool has_number = std::count(types.begin(), types.end(), "number") > 0;
  std::vector<Expr> alts;
  for (const auto& t : types) {
    if (t == "null" || t == "boolean") alts.push_back(Expr::ref(common(t)));
    else if (t == "integer" && !has_number) alts.push_back(compile_number(s, true, path));
    else if (t == "number") alts.push_back(compile_number(s, false, path));
    else if (t == "string") alts.push_back(compile_string(s, path));
    else if (t == "object") alts.push_back(compile_object(s, path));
    else if (t == "array") alts.push_back(compile_array(s, path));
    else if (t != "integer") refuse("type", path, "unknown type '" + t + "'");
  }
  // Without "type", keywords of one type leave the other types unconstrained.
  if (!typed)
    for (const char* t : {"object", "array", "string", "number", "boolean", "null"})
      if (!std::count(types.begin(), types.end(), t)) alts.push_back(Expr::ref(common(t)));
  return Expr::alt(std::move(alts));
}

bool SchemaCompiler::has_no_instance(const Json& s, const std::string& path, int depth) {
  try {
    return flat_has_no_instance(flatten(norm(s, path), path), path, depth);
  } catch (const NoInstance&) {
    return true;
  }
}

bool SchemaCompiler::flat_has_no_instance(const Json& f, const std::string& path, int depth) {
  if (unsatisfiable(f)) return true;
  // An object-only schema whose required property has no instance has none (two levels down).
  if (depth >= 2 || !f.is_object() || types_of(f) != std::vector<std::string>{"object"} || !f.contains("required") ||
      !f.contains("properties"))
    return false;
  for (const Json& k : f["required"])
    if (k.is_string() && f["properties"].contains(k.get<std::string>()) &&
        has_no_instance(f["properties"][k.get<std::string>()], path + "/properties/" + k.get<std::string>(), depth + 1))
      return true;
  return false;
}

// anyOf: every branch merged with the sibling keywords. oneOf: the same, keeping only the
// branches whose outputs provably fail every other branch (so exactly one holds).
Expr SchemaCompiler::compile_combinator(const Json& s, const std::string& key, const std::string& path, int depth) {
  const Json& list = s[key];
  if (!list.is_array() || list.empty()) refuse(key, path, "must be a non-empty array");
  Json rest = without(s, {key.c_str()});
  std::vector<Json> branches;
  std::vector<std::string> paths;
  for (size_t i = 0; i < list.size(); ++i) {
    std::string p = path + "/" + key + "/" + std::to_string(i);
    if (list[i].is_boolean() && !list[i].get<bool>()) continue;
    try {
      branches.push_back(rest.empty() ? list[i] : merge(rest, flatten(norm(list[i], p), p), p));
    } catch (const NoInstance&) {
      continue;  // (two different constants, ...): a branch nothing matches adds nothing
    }
    paths.push_back(p);
  }
  // Each branch flattened once (oneOf compares every pair; large documents have long lists).
  std::vector<std::optional<Json>> flat(branches.size());
  auto flat_at = [&](size_t j) -> const Json& {
    if (!flat[j]) {
      try {
        flat[j] = flatten(norm(branches[j], paths[j]), paths[j]);
        if (flat_has_no_instance(*flat[j], paths[j])) flat[j] = Json(false);
      } catch (const NoInstance&) {
        flat[j] = Json(false);
      }
    }
    return *flat[j];
  };
  // A branch found to have no instance while compiled is left out like an unsatisfiable one.
  std::vector<Expr> alts;
  auto add = [&](auto&& compile_it) {
    if (std::optional<Expr> e = unless_no_instance(compile_it)) alts.push_back(std::move(*e));
  };
  for (size_t i = 0; i < branches.size(); ++i) {
    Json gen = flat_at(i);
    if (unsatisfiable(gen)) continue;
    if (key == "oneOf") {
      auto exclusive = [&](const Json& g) {
        for (size_t j = 0; j < branches.size(); ++j)
          if (j != i && !never_both(g, flat_at(j))) return false;
        return true;
      };
      if (!exclusive(gen)) {  // leave out a name each other branch requires and this one does not
        Json narrowed = gen;
        for (size_t j = 0; j < branches.size(); ++j) {
          if (j == i) continue;
          const Json& other = flat_at(j);
          if (!other.is_object() || !other.contains("required")) continue;
          const Json mine = narrowed.value("required", Json::array());
          for (const Json& k : other["required"])
            if (k.is_string() && std::find(mine.begin(), mine.end(), k) == mine.end()) {
              narrowed["properties"][k.get<std::string>()] = false;
              break;
            }
        }
        if (exclusive(narrowed) && !unsatisfiable(narrowed)) {
          add([&] { return closed([&] { return compile_resolved(narrowed, paths[i], depth + 1); }); });
          continue;
        }
        // Or require a property of this branch that no other branch may have (closed objects
        // with keys of their own: {"env": ...} or {"file": ...}, where {} would match both).
        if (gen.is_object() && gen.contains("properties") && gen["properties"].is_object()) {
          const Json mine = gen.value("required", Json::array());
          std::optional<std::string> own;
          for (auto& [k, v] : gen["properties"].items()) {
            if (v == Json(false) || std::find(mine.begin(), mine.end(), Json(k)) != mine.end()) continue;
            bool others_lack = true;
            for (size_t j = 0; j < branches.size() && others_lack; ++j) {
              const Json& other = flat_at(j);
              if (j == i || !other.is_object()) continue;
              const bool other_closed = other.value("additionalProperties", Json(true)) == Json(false) &&
                                        !other.contains("patternProperties");
              const Json op = other.value("properties", Json::object());
              others_lack = other_closed && (!op.contains(k) || op[k] == Json(false));
            }
            if (others_lack) {
              own = k;
              break;
            }
          }
          if (own) {
            Json with_own = gen;
            with_own["required"].push_back(*own);
            if (exclusive(with_own) && !unsatisfiable(with_own)) {
              add([&] { return closed([&] { return compile_resolved(with_own, paths[i], depth + 1); }); });
              continue;
            }
          }
        }
        // Other branches that are one numeric or length bound: this one past each of them.
        Json past = gen;
        bool all_bounds = true;
        for (size_t j = 0; j < branches.size() && all_bounds; ++j) {
          if (j == i) continue;
          auto fail = failing_bound(flat_at(j));
          all_bounds = fail.has_value();
          if (fail) {
            try {
              past = merge(past, *fail, paths[i]);
            } catch (const Error&) {
              all_bounds = false;  // no value past the bound in this branch
            }
          }
        }
        if (all_bounds && exclusive(past) && !has_no_instance(past, paths[i])) {
          add([&] { return closed([&] { return compile_resolved(past, paths[i], depth + 1); }); });
          continue;
        }
      }
      if (!exclusive(gen)) {  // keep the types of the branch that no other branch accepts
        Json kept = Json::array();
        for (const auto& t : types_of(gen)) {
          Json g = gen;
          g["type"] = t;
          if (exclusive(g)) kept.push_back(t);
        }
        if (kept.empty() || kept.size() == types_of(gen).size()) continue;
        gen["type"] = kept;
        add([&] { return closed([&] { return compile_resolved(gen, paths[i], depth + 1); }); });
        continue;
      }
    }
    auto branch = [&] {
      return rest.empty() ? compile(branches[i], paths[i]) : compile_resolved(branches[i], paths[i], depth + 1);
    };
    add([&] { return key == "oneOf" ? closed(branch) : branch(); });
  }
  if (alts.empty()) {
    if (key == "anyOf") no_instance("anyOf", path, "no branch is satisfiable");
    unsupported(key, path, "the branches are not provably exclusive");
    for (size_t i = 0; i < branches.size(); ++i) add([&] { return compile(branches[i], paths[i]); });
    if (alts.empty()) no_instance(key, path, "no branch is satisfiable");
  }
  return as_rule(key == "anyOf" ? "any" : "one", Expr::alt(std::move(alts)));
}

// if/then/else: outputs that satisfy `if` and `then`, and where provable, outputs of `else`
// that cannot satisfy `if` (if necessary with a property that `if` requires left out, or, for
// an `if` that is one numeric or length bound, restricted to the values past it).
Expr SchemaCompiler::compile_conditional(const Json& s, const std::string& path, int depth) {
  Json rest = without(s, {"if", "then", "else"});
  Json cond = flatten(norm(s["if"], path + "/if"), path + "/if");
  std::vector<Expr> alts;
  // The `if` side: left out where it has no instance (found when merged, flattened or compiled).
  std::optional<Expr> then_expr = unless_no_instance([&] {
    Json then_branch = merge(merge(rest, cond, path), s.contains("then") ? flatten(norm(s["then"], path), path) : Json(true), path);
    if (unsatisfiable(flatten(then_branch, path))) no_instance("then", path, "no instance");
    return compile_resolved(then_branch, path + "/then", depth + 1);
  });
  if (then_expr) alts.push_back(std::move(*then_expr));
  Json else_branch;
  try {
    else_branch = merge(rest, s.contains("else") ? flatten(norm(s["else"], path), path) : Json(true), path);
  } catch (const NoInstance&) {
    if (alts.empty()) throw;  // neither side has an instance
    return as_rule("if", Expr::alt(std::move(alts)));
  }
  if (!never_both(else_branch, cond) && cond.is_object() && cond.contains("required")) {
    for (const Json& k : cond["required"]) {  // leave out a property `if` requires
      const Json& req = else_branch.value("required", Json::array());
      if (std::find(req.begin(), req.end(), k) != req.end()) continue;
      else_branch["properties"][k.get<std::string>()] = false;
      break;
    }
  }
  bool excluded = never_both(else_branch, cond);
  if (!excluded)
    if (auto fail = failing_bound(cond)) {  // `if` a single bound: else takes the values past it
      try {
        else_branch = merge(else_branch, *fail, path);
        excluded = true;
      } catch (const NoInstance&) {  // no value past the bound: the `if` side only
      }
    }
  bool else_dead = false;
  if (excluded) {
    std::optional<Expr> e;
    if (!has_no_instance(else_branch, path))
      e = unless_no_instance([&] { return closed([&] { return compile_resolved(else_branch, path + "/else", depth + 1); }); });
    if (e) alts.push_back(std::move(*e));
    else else_dead = true;
  }
  if (alts.empty()) {
    if (!then_expr && else_dead) no_instance("if", path, "neither branch has an instance");
    refuse("if", path, "neither branch is provably satisfiable");
  }
  return as_rule("if", Expr::alt(std::move(alts)));
}

// not: outputs of the rest that provably fail the negated schema, after the rewrites that make
// them so (required names left out, types removed, enum values removed, a single numeric or
// length bound turned into the values past it).
Expr SchemaCompiler::compile_not(Json s, const std::string& path, int depth) {
  std::string p = path + "/not";
  Json neg = flatten(norm(s["not"], p), p);
  s.erase("not");
  // {"required": [...]}, also with "type": "object" (a value that is not an object fails it anyway).
  auto only_required = [](const Json& n) {
    if (!n.is_object() || !n.contains("required") || !n["required"].is_array()) return false;
    return n.size() == 1 || (n.size() == 2 && n.contains("type") && types_of(n) == std::vector<std::string>{"object"});
  };
  auto requires_of = [&](const Json& n) {
    std::vector<std::vector<std::string>> out;
    if (only_required(n)) out.push_back(n["required"].get<std::vector<std::string>>());
    if (n.is_object() && n.size() == 1 && n.contains("anyOf"))
      for (const Json& b : n["anyOf"])
        if (only_required(b)) out.push_back(b["required"].get<std::vector<std::string>>());
    return out;
  };
  for (const auto& names : requires_of(neg)) {
    const Json& req = s.value("required", Json::array());
    for (const auto& k : names)
      if (std::find(req.begin(), req.end(), k) == req.end()) {
        s["properties"][k] = false;
        break;
      }
  }
  if (neg.is_object() && neg.size() == 1 && neg.contains("type")) {
    std::vector<std::string> keep;
    auto banned = types_of(neg);
    for (const auto& t : types_of(s))
      if (!std::count(banned.begin(), banned.end(), t) && !(t == "integer" && std::count(banned.begin(), banned.end(), "number")))
        keep.push_back(t);
    s["type"] = keep;
  }
  if (neg.is_object() && (neg.contains("enum") || neg.contains("const")) && s.contains("enum")) {
    Json vals = neg.contains("const") ? Json::array({neg["const"]}) : neg["enum"], kept = Json::array();
    for (const Json& v : s["enum"])
      if (std::find(vals.begin(), vals.end(), v) == vals.end()) kept.push_back(v);
    s["enum"] = kept;
  }
  if (auto fail = failing_bound(neg)) s = merge(s, *fail, p);  // a single bound: the values past it
  else if (!never_both(s, neg)) unsupported("not", path, "the negated schema is not provably excluded");
  return closed([&] { return compile_resolved(std::move(s), path, depth + 1); });
}

Expr SchemaCompiler::value_expr(const Json& v) {
  if (v.is_array()) {
    std::vector<Expr> parts{Expr::literal("[")};
    for (size_t i = 0; i < v.size(); ++i) {
      if (i > 0) parts.insert(parts.end(), {Expr::literal(","), sp()});
      parts.push_back(value_expr(v[i]));
    }
    parts.push_back(Expr::literal("]"));
    return Expr::seq(std::move(parts));
  }
  if (v.is_object()) {
    // Every order of up to 4 keys (24 orders); larger objects in their own order only.
    std::vector<std::string> keys;
    for (const auto& [k, x] : v.items()) keys.push_back(k);
    std::vector<size_t> order(keys.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::vector<Expr> alts;
    do {
      std::vector<Expr> parts{Expr::literal("{")};
      for (size_t i = 0; i < order.size(); ++i) {
        if (i > 0) parts.insert(parts.end(), {Expr::literal(","), sp()});
        parts.insert(parts.end(), {Expr::literal(Json(keys[order[i]]).dump()), Expr::literal(":"), sp(),
                                   value_expr(v[keys[order[i]]])});
      }
      parts.push_back(Expr::literal("}"));
      alts.push_back(Expr::seq(std::move(parts)));
    } while (keys.size() <= 4 && std::next_permutation(order.begin(), order.end()));
    return alts.size() == 1 ? std::move(alts[0]) : Expr::alt(std::move(alts));
  }
  if (v.is_number()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) <= 9007199254740992.0) {  // exact in a double
      const std::string n = v.is_number_float() ? Json(int64_t(d)).dump() : v.dump();
      std::vector<Expr> alts{Expr::literal(n), Expr::literal(n + ".0")};
      if (d == 0) alts.insert(alts.end(), {Expr::literal("-0"), Expr::literal("-0.0")});
      return Expr::alt(std::move(alts));
    }
  }
  return Expr::literal(v.dump());
}

Expr SchemaCompiler::compile_enum(const Json& s, const std::string& path) {
  Json values = s.contains("const") ? Json::array({s["const"]}) : s["enum"];
  if (!values.is_array()) refuse("enum", path, "must be an array");
  if (s.contains("const") && s.contains("enum") &&
      std::find(s["enum"].begin(), s["enum"].end(), s["const"]) == s["enum"].end())
    no_instance("const", path, "not among the enum values (no instance is valid)");
  Json rest = without(s, {"enum", "const"});
  std::vector<Expr> alts;
  for (const Json& v : values)
    if (value_satisfies(v, rest)) alts.push_back(value_expr(v));
  if (alts.empty()) no_instance(s.contains("const") ? "const" : "enum", path, "no value satisfies the other keywords");
  return Expr::alt(std::move(alts));
}

}  // namespace schema

std::shared_ptr<const Grammar> grammar_from_json_schema_json(const nlohmann::ordered_json& schema,
                                                             const SchemaOptions& opts, SchemaReport* report) {
  SchemaReport local;
  SchemaReport* r = report ? report : &local;
  std::shared_ptr<const Grammar> g;
  try {
    g = schema::SchemaCompiler(schema, opts, r).run();
  } catch (const nlohmann::json::exception& e) {  // a keyword with a value of the wrong kind
    fail("json schema: malformed schema: ", e.what());
  }
  // The debug log of what was ignored (annotations, unknown keywords).
  if (std::getenv("FATHOM_DEBUG_SCHEMA"))
    for (const auto& k : r->ignored) std::cerr << "json schema: ignored " << k << "\n";
  return g;
}

std::shared_ptr<const Grammar> grammar_from_json_schema(std::string_view schema_text, const SchemaOptions& opts,
                                                        SchemaReport* report) {
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(schema_text);
  } catch (const nlohmann::json::exception& e) {
    fail("json schema: invalid JSON: ", e.what());
  }
  return grammar_from_json_schema_json(j, opts, report);
}

std::shared_ptr<const Grammar> json_object_grammar() {
  static const nlohmann::ordered_json kEmpty = nlohmann::ordered_json::object();
  return schema::SchemaCompiler(kEmpty, {}, nullptr).any_object();
}

}  // namespace fathom::grammar
