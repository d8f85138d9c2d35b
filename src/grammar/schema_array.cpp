// Arrays: prefixItems then items, minItems/maxItems, contains (minContains items anywhere, or
// with prefixItems / maxItems the first minContains) and uniqueItems where every position takes
// one of a few constants (an enum, a const, booleans: distinct ones exactly); uniqueItems over
// other items is refused (best effort: unenforced).
#include <algorithm>
#include <functional>
#include <optional>

#include "core/error.h"
#include "grammar/schema_compiler.h"

namespace fathom::grammar::schema {

namespace {

int count(const Json& s, const char* key, const std::string& path, int dflt) {
  if (!s.contains(key)) return dflt;
  const Json& v = s[key];
  if (!v.is_number() || v.get<double>() < 0) refuse(key, path, "must be a non-negative integer");
  return static_cast<int>(std::min<double>(v.get<double>(), 100000));
}

Json all_of(const Json& x, const Json& y) {
  if (y.is_boolean() && y.get<bool>()) return x;
  if (x.is_boolean() && x.get<bool>()) return y;
  return Json{{"allOf", Json::array({x, y})}};
}

}  // namespace

Expr SchemaCompiler::compile_array(const Json& s, const std::string& path) {
  Json prefix = s.value("prefixItems", Json::array());
  Json items = s.contains("items") ? s["items"] : s.value("unevaluatedItems", Json(true));
  int min = count(s, "minItems", path, 0), max = count(s, "maxItems", path, -1);
  int need = 0;  // leading items that must match `contains`
  if (s.contains("contains")) {
    need = count(s, "minContains", path, 1);
    if (s.contains("maxContains")) unsupported("maxContains", path, "only minContains is enforced");
    min = std::max(min, need);
  }
  if (max >= 0 && max < min) no_instance("maxItems", path, "below minItems or minContains (no instance is valid)");
  if (s.value("uniqueItems", false)) {
    // Exact only where every position takes one of a few constants; anything else would need
    // the grammar to remember arbitrary values, so it is refused (best effort: left unenforced).
    std::optional<std::vector<Json>> item_vals;
    if (items != Json(false)) item_vals = constant_values(items, path + "/items");
    std::vector<std::vector<Json>> prefix_vals;
    for (size_t i = 0; i < prefix.size(); ++i)
      if (auto v = constant_values(prefix[i], path + "/prefixItems/" + std::to_string(i))) prefix_vals.push_back(*v);
    const bool finite = need == 0 && prefix_vals.size() == prefix.size() && (items == Json(false) || item_vals);
    if (finite && prefix.empty()) {
      if (min > static_cast<int>(item_vals->size())) no_instance("minItems", path, "more unique items than the items' values");
      return unique_values(*item_vals, min, max);
    }
    if (finite) {
      if (auto e = unique_tuples(prefix_vals, item_vals ? &*item_vals : nullptr, min, max, path)) return *e;
      unsupported("uniqueItems", path, "over prefixItems with too many combinations of their constants");
    } else {
      unsupported("uniqueItems", path,
                  "over items that are not a few constants (a grammar cannot keep general values distinct)");
    }
  }
  // contains without prefixItems, maxItems or a larger minItems: the matching items anywhere,
  // "[" (X ,)* M ( , (X ,)* M ){need - 1} ( , X)* "]" with X an item and M one that also matches
  // `contains` (at least `need` of them, in any places).
  if (need > 0 && prefix.empty() && max < 0 && min <= need && items != Json(false)) {
    Expr sep = Expr::seq({Expr::literal(","), sp()});
    Expr x = as_rule("item", compile(items, path + "/items"));
    Expr m = as_rule("match", compile(all_of(items, s["contains"]), path + "/contains"));
    Expr skip = Expr::repeat(Expr::seq({x, sep}), 0, -1);
    std::vector<Expr> parts{Expr::literal("["), skip, m};
    for (int i = 1; i < need; ++i) parts.insert(parts.end(), {sep, skip, m});
    parts.push_back(Expr::repeat(Expr::seq({sep, x}), 0, -1));
    parts.push_back(Expr::literal("]"));
    return Expr::seq(std::move(parts));
  }
  int positions = std::max(static_cast<int>(prefix.size()), need);
  if (max >= 0) positions = std::min(positions, max);
  auto schema_at = [&](int i) {
    Json x = i < static_cast<int>(prefix.size()) ? prefix[i] : items;
    return i < need ? all_of(x, s["contains"]) : x;
  };
  bool more = items != Json(false);
  if (!more && min > positions) no_instance("items", path, "no items allowed past prefixItems but minItems is larger");
  Expr comma = Expr::seq({Expr::literal(","), sp()});
  if (positions == 0) {
    if (!more) return Expr::literal("[]");
    return list("[", as_rule("item", compile(items, path + "/items")), min, max, "]");
  }
  // T_i: the items from position i on (a comma before each but the first).
  Expr tail = Expr::empty();
  if (more && (max < 0 || max > positions))
    tail = Expr::repeat(Expr::seq({comma, as_rule("item", compile(items, path + "/items"))}),
                        std::max(0, min - positions), max < 0 ? -1 : max - positions);
  for (int i = positions; i-- > 0;) {
    Json si = schema_at(i);
    if (si == Json(false)) {
      if (i < min) no_instance("prefixItems", path, "a required position allows no value");
      tail = Expr::empty();
      continue;
    }
    Expr elem = as_rule("item", compile(si, path + "/prefixItems/" + std::to_string(i)));
    Expr step = i == 0 ? Expr::seq({elem, tail}) : Expr::seq({comma, elem, tail});
    tail = as_rule("items", i < min ? std::move(step) : Expr::alt({std::move(step), Expr::empty()}));
  }
  return Expr::seq({Expr::literal("["), tail, Expr::literal("]")});
}

std::optional<std::vector<Json>> SchemaCompiler::constant_values(const Json& schema, const std::string& path) {
  const Json it = flatten(norm(schema, path), path);
  std::vector<Json> vals;
  if (it == Json(false)) return vals;
  if (it.is_object() && (it.contains("enum") || it.contains("const")) &&
      !has_any(it, {"anyOf", "oneOf", "not", "if", "allOf"})) {
    const Json all = it.contains("const") ? Json::array({it["const"]}) : it["enum"];
    const Json rest = without(it, {"enum", "const"});
    if (!all.is_array()) return std::nullopt;
    for (const Json& v : all)
      if (value_satisfies(v, rest) && std::find(vals.begin(), vals.end(), v) == vals.end()) vals.push_back(v);
  } else if (it == Json{{"type", "boolean"}}) {
    vals = {Json(false), Json(true)};
  } else {
    return std::nullopt;
  }
  if (vals.size() > kMaxUniqueValues) return std::nullopt;
  return vals;
}

std::optional<Expr> SchemaCompiler::unique_tuples(const std::vector<std::vector<Json>>& prefix_vals,
                                                  const std::vector<Json>* item_vals, int min, int max,
                                                  const std::string& path) {
  // A tree of the distinct sequences: one node per sequence written so far, so bounded. A
  // sequence that cannot be finished (a required position with every value used) is left out,
  // so the grammar has no dead ends.
  constexpr int kMaxNodes = 4096;
  int nodes = 0;
  std::vector<Json> used;
  std::function<std::optional<Expr>()> from_here = [&]() -> std::optional<Expr> {
    if (++nodes > kMaxNodes) return std::nullopt;
    const size_t i = used.size();
    std::vector<Expr> alts;
    if (static_cast<int>(i) >= min) alts.push_back(Expr::literal("]"));
    const std::vector<Json>* domain = i < prefix_vals.size() ? &prefix_vals[i] : item_vals;
    if (domain && (max < 0 || static_cast<int>(i) < max))
      for (const Json& v : *domain) {
        if (std::find(used.begin(), used.end(), v) != used.end()) continue;
        used.push_back(v);
        std::optional<Expr> rest = from_here();
        used.pop_back();
        if (!rest) continue;
        std::vector<Expr> step;
        if (i > 0) step.insert(step.end(), {Expr::literal(","), sp()});
        step.insert(step.end(), {value_expr(v), std::move(*rest)});
        alts.push_back(Expr::seq(std::move(step)));
      }
    if (alts.empty()) return std::nullopt;
    return Expr::alt(std::move(alts));
  };
  std::optional<Expr> body = from_here();
  if (nodes > kMaxNodes) return std::nullopt;
  if (!body) no_instance("uniqueItems", path, "no array of distinct values meets minItems and prefixItems");
  return Expr::seq({Expr::literal("["), std::move(*body)});
}

Expr SchemaCompiler::unique_values(const std::vector<Json>& vals, int min, int max) {
  const size_t n = vals.size();
  const int top = max < 0 ? static_cast<int>(n) : std::min(max, static_cast<int>(n));
  // Rules only for the sets an array can reach (at most `top` values).
  std::vector<uint32_t> rule(size_t(1) << n);
  for (size_t used = 0; used < rule.size(); ++used)
    if (__builtin_popcountll(used) <= top) rule[used] = new_rule("unique");
  for (size_t used = 0; used < rule.size(); ++used) {
    const int size = __builtin_popcountll(used);
    if (size > top) continue;
    std::vector<Expr> alts;
    if (size >= min) alts.push_back(Expr::literal("]"));
    if (size < top)
      for (size_t i = 0; i < n; ++i)
        if (!(used >> i & 1)) {
          std::vector<Expr> step;
          if (size > 0) step.insert(step.end(), {Expr::literal(","), sp()});
          step.insert(step.end(), {value_expr(vals[i]), Expr::ref(rule[used | size_t(1) << i])});
          alts.push_back(Expr::seq(std::move(step)));
        }
    define(rule[used], alts.size() == 1 ? std::move(alts[0]) : Expr::alt(std::move(alts)));
  }
  return Expr::seq({Expr::literal("["), Expr::ref(rule[0])});
}

}  // namespace fathom::grammar::schema
