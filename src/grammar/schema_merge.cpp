// allOf: two normalized schemas merged into one whose instances satisfy both.
#include <algorithm>
#include <numeric>
#include <regex>

#include "core/error.h"
#include "grammar/schema_compiler.h"

namespace fathom::grammar::schema {

namespace {

Json all_of(const Json& x, const Json& y) {
  if (x == y || (y.is_boolean() && y.get<bool>())) return x;
  if (x.is_boolean() && x.get<bool>()) return y;
  if (x.is_boolean() || y.is_boolean()) return false;
  return Json{{"allOf", Json::array({x, y})}};
}

// A key may match the ECMA-262 pattern (true when the pattern is beyond std::regex).
bool may_match(const std::string& key, const std::string& pattern) {
  try {
    return std::regex_search(key, std::regex(pattern, std::regex::ECMAScript));
  } catch (const std::regex_error&) {
    return true;
  }
}

Json merge_types(const Json& a, const Json& b) {
  std::vector<std::string> ta = types_of(a), tb = types_of(b), out;
  for (const auto& t : ta) {
    if (std::count(tb.begin(), tb.end(), t)) out.push_back(t);
    else if (t == "integer" && std::count(tb.begin(), tb.end(), "number")) out.push_back(t);
    else if (t == "number" && std::count(tb.begin(), tb.end(), "integer")) out.push_back("integer");
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// The property schemas of `a` constrained by `b`'s additionalProperties/patternProperties for
// names `b` does not declare (allOf semantics keeps each branch's view of "additional").
void constrain_foreign(Json& props, Json& pattern_props, const Json& b) {
  const Json empty = Json::object();
  const Json& bp = b.contains("properties") ? b["properties"] : empty;
  const Json& bpp = b.contains("patternProperties") ? b["patternProperties"] : empty;
  // b's unevaluatedProperties cannot see a's properties either (b is a subschema of a's scope).
  const char* extra = b.contains("additionalProperties") ? "additionalProperties"
                      : b.contains("unevaluatedProperties") ? "unevaluatedProperties" : nullptr;
  for (auto& [k, v] : props.items()) {
    if (bp.contains(k)) continue;
    bool matched = false;
    for (auto& [p, ps] : bpp.items())
      if (may_match(k, p)) v = all_of(v, ps), matched = true;
    if (!matched && extra) v = all_of(v, b[extra]);
  }
  if (extra)
    for (auto& [p, ps] : pattern_props.items())
      if (!bpp.contains(p)) ps = all_of(ps, b[extra]);
}

// Positions of a's prefixItems past b's are b's `items` too (and the other way round).
void merge_arrays(Json& out, const Json& a, const Json& b) {
  Json pa = a.value("prefixItems", Json::array()), pb = b.value("prefixItems", Json::array());
  for (size_t i = pb.size(); i < pa.size(); ++i)
    if (b.contains("items")) pa[i] = all_of(pa[i], b["items"]);
  for (size_t i = pa.size(); i < pb.size(); ++i)
    if (a.contains("items")) pb[i] = all_of(pb[i], a["items"]);
  for (size_t i = 0; i < pb.size(); ++i) {
    if (i < pa.size()) pa[i] = all_of(pa[i], pb[i]);
    else pa.push_back(pb[i]);
  }
  if (!pa.empty()) out["prefixItems"] = pa;
}

void merge_objects(Json& out, const Json& a, const Json& b) {
  Json pa = a.value("properties", Json::object()), pb = b.value("properties", Json::object());
  Json ppa = a.value("patternProperties", Json::object()), ppb = b.value("patternProperties", Json::object());
  constrain_foreign(pa, ppa, b);
  constrain_foreign(pb, ppb, a);
  for (auto& [k, v] : pb.items()) pa[k] = pa.contains(k) ? all_of(pa[k], v) : v;
  for (auto& [k, v] : ppb.items()) ppa[k] = ppa.contains(k) ? all_of(ppa[k], v) : v;
  if (!pa.empty()) out["properties"] = pa;
  if (!ppa.empty()) out["patternProperties"] = ppa;
}

}  // namespace

Json merge(const Json& a, const Json& b, const std::string& path) {
  if (b.is_boolean()) {
    if (!b.get<bool>()) no_instance("allOf", path, "contains the false schema (no instance is valid)");
    return a;
  }
  if (a.is_boolean()) return merge(b, a, path);
  Json out = a;
  merge_objects(out, a, b);
  merge_arrays(out, a, b);
  static const std::set<std::string> kMax = {"minimum", "exclusiveMinimum", "minLength", "minItems",
                                             "minProperties", "minContains"};
  static const std::set<std::string> kMin = {"maximum", "exclusiveMaximum", "maxLength", "maxItems",
                                             "maxProperties", "maxContains"};
  static const std::set<std::string> kAllOf = {"additionalProperties", "items", "contains", "propertyNames",
                                               "unevaluatedProperties", "unevaluatedItems"};
  for (auto& [k, v] : b.items()) {
    if (k == "properties" || k == "patternProperties" || k == "prefixItems") continue;
    if (!out.contains(k)) {
      out[k] = v;
      continue;
    }
    Json& x = out[k];
    if (x == v && k != "allOf") continue;
    if (k == "type") {
      x = merge_types(a, b);
    } else if (k == "enum") {
      Json kept = Json::array();
      for (const Json& e : x)
        if (v.is_array() && std::find(v.begin(), v.end(), e) != v.end()) kept.push_back(e);
      x = kept;
    } else if (k == "const") {
      no_instance("allOf", path, "two different constants (no instance is valid)");
    } else if (kMax.count(k)) {
      if (v.is_number() && x.is_number() && v.get<double>() > x.get<double>()) x = v;
    } else if (kMin.count(k)) {
      if (v.is_number() && x.is_number() && v.get<double>() < x.get<double>()) x = v;
    } else if (k == "multipleOf") {
      if (!x.is_number_integer() || !v.is_number_integer() || x.get<int64_t>() <= 0 || v.get<int64_t>() <= 0 ||
          x.get<int64_t>() > 1000000 || v.get<int64_t>() > 1000000)
        refuse("multipleOf", path, "two multipleOf in allOf that are not integers up to 10^6");
      x = std::lcm(x.get<int64_t>(), v.get<int64_t>());
    } else if (k == "uniqueItems") {
      x = x.get<bool>() || v.get<bool>();
    } else if (k == "required") {
      for (const Json& r : v)
        if (std::find(x.begin(), x.end(), r) == x.end()) x.push_back(r);
    } else if (k == "dependentRequired" || k == "dependentSchemas") {
      for (auto& [dk, dv] : v.items()) {
        if (!x.contains(dk)) x[dk] = dv;
        else if (k == "dependentSchemas") x[dk] = all_of(x[dk], dv);
        else for (const Json& r : dv) x[dk].push_back(r);
      }
    } else if (kAllOf.count(k)) {
      x = all_of(x, v);
    } else if (k == "allOf") {
      for (const Json& e : v) x.push_back(e);
    } else if (k == "anyOf" || k == "oneOf" || k == "not" || k == "$ref" || k == "$dynamicRef" ||
               k == "$recursiveRef") {
      out["allOf"].push_back(Json{{k, v}});  // applied by a later round of compile
    } else if (k == "if" || k == "then" || k == "else") {
      if (k != "if" && a.contains("if") && a["if"] == b["if"]) {
        x = all_of(x, v);
      } else if (k == "if") {
        Json cond = {{"if", v}};
        if (b.contains("then")) cond["then"] = b["then"];
        if (b.contains("else")) cond["else"] = b["else"];
        out["allOf"].push_back(cond);
      }
    } else if (k == "pattern" || k == "format") {
      refuse(k, path, "two different values in allOf");
    } else {
      refuse(k, path, "no merge in allOf");
    }
  }
  // b's if/then/else moved as a unit: drop the halves copied before a's own if was seen.
  if (a.contains("if") && b.contains("if") && a["if"] != b["if"]) {
    out["then"] = a.value("then", Json(true));
    out["else"] = a.value("else", Json(true));
    if (!a.contains("then")) out.erase("then");
    if (!a.contains("else")) out.erase("else");
  }
  return out;
}

}  // namespace fathom::grammar::schema
