// Reasoning about instances without a grammar: enum/const values against sibling keywords,
// and whether the outputs of one schema can satisfy another (oneOf, not, else).
#include <algorithm>
#include <cmath>
#include <regex>

#include "core/error.h"
#include "grammar/schema_compiler.h"

namespace fathom::grammar::schema {

namespace {

bool has(const std::vector<std::string>& v, const std::string& x) { return std::count(v.begin(), v.end(), x) > 0; }

// Python jsonschema's type of a JSON value (1.0 is an integer, true is not a number).
bool is_type(const Json& v, const std::string& t) {
  if (t == "null") return v.is_null();
  if (t == "boolean") return v.is_boolean();
  if (t == "string") return v.is_string();
  if (t == "object") return v.is_object();
  if (t == "array") return v.is_array();
  if (t == "number") return v.is_number();
  if (t == "integer") return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
  return false;
}

size_t codepoints(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// The values a schema allows (const/enum), or none when it does not list them.
std::optional<Json> listed(const Json& s) {
  if (!s.is_object()) return std::nullopt;
  if (s.contains("const")) return Json::array({s["const"]});
  if (s.contains("enum") && s["enum"].is_array()) return s["enum"];
  return std::nullopt;
}

std::vector<std::string> gen_types(const Json& s) {
  if (auto vals = listed(s)) {  // the types of the listed values
    std::vector<std::string> out;
    for (const Json& v : *vals)
      for (const char* t : {"null", "boolean", "string", "object", "array", "integer", "number"})
        if (is_type(v, t) && !(std::string(t) == "number" && is_type(v, "integer"))) out.push_back(t);
    return out;
  }
  return types_of(s);
}

Json without_lists(Json s) {
  s.erase("enum"), s.erase("const");
  return s;
}

}  // namespace

bool value_satisfies(const Json& v, const Json& s, bool unsure) {
  if (s.is_boolean()) return s.get<bool>();
  for (auto& [k, x] : s.items()) {
    if (k == "type") {
      bool any = false;
      for (const auto& t : types_of(s)) any |= is_type(v, t);
      if (!any) return false;
    } else if (k == "minLength" || k == "maxLength" || k == "pattern") {
      if (!v.is_string()) continue;
      std::string str = v.get<std::string>();
      double n = x.is_number() ? x.get<double>() : 0;  // (as double: a huge or negative bound is no UB)
      if (k == "minLength" && static_cast<double>(codepoints(str)) < n) return false;
      if (k == "maxLength" && static_cast<double>(codepoints(str)) > n) return false;
      if (k == "pattern") {
        try {
          if (!std::regex_search(str, std::regex(x.get<std::string>(), std::regex::ECMAScript))) return false;
        } catch (const std::regex_error&) {
          if (!unsure) return false;
        }
      }
    } else if (k == "minimum" || k == "maximum" || k == "exclusiveMinimum" || k == "exclusiveMaximum") {
      if (!v.is_number()) continue;
      double a = v.get<double>(), b = x.get<double>();
      if ((k == "minimum" && a < b) || (k == "maximum" && a > b) || (k == "exclusiveMinimum" && a <= b) ||
          (k == "exclusiveMaximum" && a >= b))
        return false;
    } else if (k == "format" && !v.is_string()) {
      continue;
    } else {
      // Object/array keywords only constrain their types; anything else is not checked here.
      static const std::set<std::string> kObject = {"properties", "required", "additionalProperties",
                                                    "patternProperties", "propertyNames", "minProperties",
                                                    "maxProperties", "dependentRequired", "dependentSchemas",
                                                    "unevaluatedProperties"};
      static const std::set<std::string> kArray = {"items", "prefixItems", "minItems", "maxItems", "contains",
                                                   "uniqueItems", "minContains", "maxContains", "unevaluatedItems"};
      if (kObject.count(k) && !v.is_object()) continue;
      if (kArray.count(k) && !v.is_array()) continue;
      if (k == "multipleOf" && !v.is_number()) continue;
      if (!unsure) return false;
    }
  }
  return true;
}

namespace {

// The numeric range a schema's bounds leave: [lo, hi], each end open or closed.
struct Range {
  double lo = -INFINITY, hi = INFINITY;
  bool lo_open = false, hi_open = false;
};
Range range_of(const Json& s) {
  Range r;
  auto num = [&](const char* k, double& at, bool& open, bool is_open, bool lower) {
    if (!s.contains(k) || !s[k].is_number()) return;
    const double v = s[k].get<double>();
    if (lower ? (v > at || (v == at && is_open)) : (v < at || (v == at && is_open))) at = v, open = is_open;
  };
  num("minimum", r.lo, r.lo_open, false, true);
  num("exclusiveMinimum", r.lo, r.lo_open, true, true);
  num("maximum", r.hi, r.hi_open, false, false);
  num("exclusiveMaximum", r.hi, r.hi_open, true, false);
  return r;
}

bool ranges_disjoint(const Json& a, const Json& b) {
  const Range x = range_of(a), y = range_of(b);
  auto below = [](const Range& p, const Range& q) { return p.hi < q.lo || (p.hi == q.lo && (p.hi_open || q.lo_open)); };
  return below(x, y) || below(y, x);
}

}  // namespace

bool SchemaCompiler::never_both(const Json& gen_raw, const Json& other_raw, int depth) {
  if (depth > 8) return false;
  if (other_raw.is_boolean()) return !other_raw.get<bool>();
  if (gen_raw.is_boolean()) return false;
  // A property's schema merged from two places is an allOf (or a $ref): flattened, its constants
  // and types show.
  Json gen_flat;
  if (gen_raw.contains("allOf") || gen_raw.contains("$ref")) {
    try {
      gen_flat = flatten(norm(gen_raw, "#"), "#");
    } catch (const Error&) {
      return false;
    }
    if (gen_flat.is_boolean()) return !gen_flat.get<bool>();
  }
  const Json& gen = gen_flat.is_null() ? gen_raw : gen_flat;
  Json other;
  try {
    other = flatten(norm(other_raw, "#"), "#");
  } catch (const Error&) {
    return false;
  }
  if (other.is_boolean()) return !other.get<bool>();
  if (other.contains("anyOf") || other.contains("oneOf")) {
    // Failing other's own keywords beside the combinator is enough; else failing every branch.
    if (Json rest = without(other, {"anyOf", "oneOf"}); rest.is_object() && !rest.empty() && never_both(gen, rest, depth + 1))
      return true;
    const Json& list = other.contains("anyOf") ? other["anyOf"] : other["oneOf"];
    for (const Json& b : list)
      if (!never_both(gen, b, depth + 1)) return false;
    return true;
  }
  if (auto vals = listed(gen)) {  // every listed value fails `other` (checked keyword by keyword)
    bool all_fail = true;
    auto other_vals = listed(other);
    for (const Json& v : *vals) {
      bool fails = other_vals ? std::find(other_vals->begin(), other_vals->end(), v) == other_vals->end()
                              : !value_satisfies(v, without_lists(other), true);
      all_fail &= fails;
    }
    if (all_fail) return true;
  }
  std::vector<std::string> tg = gen_types(gen), to = types_of(other);
  bool overlap = false;
  for (const auto& t : tg) overlap |= has(to, t) || (t == "integer" && has(to, "number")) || (t == "number" && has(to, "integer"));
  if (!overlap) return true;
  // Numbers: the ranges the bounds leave do not meet (other's bounds apply to every number).
  if (std::all_of(tg.begin(), tg.end(), [](const std::string& t) { return t == "integer" || t == "number"; }) &&
      ranges_disjoint(gen, other))
    return true;
  if (tg != std::vector<std::string>{"object"}) return false;
  // Objects: generated keys are the declared ones (plus extras only if allowed).
  Json gp = gen.value("properties", Json::object()), op = other.value("properties", Json::object());
  Json greq = gen.value("required", Json::array()), oreq = other.value("required", Json::array());
  // (dependentSchemas may bring in any key; dependentRequired's names may be written.)
  bool extras = (gen.contains("additionalProperties") && gen["additionalProperties"] != Json(false)) ||
                gen.contains("patternProperties") || gen.contains("dependentSchemas");
  const Json gdep = gen.value("dependentRequired", Json::object());
  auto may_emit = [&](const std::string& k) {
    if (extras || (gp.contains(k) && gp[k] != Json(false))) return true;
    if (!gp.contains(k) && std::find(greq.begin(), greq.end(), k) != greq.end()) return true;  // required, undeclared
    for (auto& [t, deps] : gdep.items())
      if (t == k || std::find(deps.begin(), deps.end(), k) != deps.end()) return !gp.contains(k);
    return false;
  };
  for (const Json& k : oreq)
    if (k.is_string() && !may_emit(k.get<std::string>())) return true;
  bool other_closed = other.contains("additionalProperties") && other["additionalProperties"] == Json(false) &&
                      !other.contains("patternProperties");
  for (const Json& k : greq) {
    if (!k.is_string()) continue;
    std::string key = k.get<std::string>();
    if (other_closed && !op.contains(key)) return true;
    if (op.contains(key) && gp.contains(key) && never_both(gp[key], op[key], depth + 1)) return true;
  }
  return false;
}

}  // namespace fathom::grammar::schema
