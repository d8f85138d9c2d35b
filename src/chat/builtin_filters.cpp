// jinja2's builtin filters, as transformers' chat templates use them.
#include "chat/builtins.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <map>

#include "chat/builtin_helpers.h"
#include "chat/interpreter.h"
#include "chat/text.h"

namespace fathom::chat {
namespace {

using namespace builtin;

Value f_tojson(Interpreter&, const Value& v, CallArgs& a) {
  JsonOptions o;
  o.ensure_ascii = arg(a, 0, "ensure_ascii", kFalse).truthy();
  const Value& indent = arg(a, 1, "indent", kNone);
  const Value& seps = arg(a, 2, "separators", kNone);
  o.sort_keys = arg(a, 3, "sort_keys", kFalse).truthy();
  if (!indent.is_none()) {
    o.has_indent = true;
    if (indent.is_string()) o.indent = indent.s;
    else if (is_int(indent)) o.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, to_int(indent))), ' ');
    else runtime_fail("indent must be an int or str");
    o.item_sep = ",";
  }
  if (!seps.is_none()) {
    if (!seps.is_list() || seps.list->items.size() != 2) runtime_fail("separators must be a (item, key) pair");
    o.item_sep = need_str(seps.list->items[0], "separator");
    o.key_sep = need_str(seps.list->items[1], "separator");
  }
  return Value::string(to_json(v, o));
}

Value f_trim(Interpreter&, const Value& v, CallArgs& a) {
  const Value& chars = arg(a, 0, "chars", kNone);
  std::string c = chars.is_none() ? "" : to_str(chars);
  return Value::string(py_strip(to_str(v), chars.is_none() ? nullptr : &c, true, true));
}
Value f_length(Interpreter&, const Value& v, CallArgs&) { return Value::integer(length_of(v)); }
Value f_string(Interpreter&, const Value& v, CallArgs&) { return Value::string(to_str(v)); }
Value f_lower(Interpreter&, const Value& v, CallArgs&) { return Value::string(py_lower(to_str(v))); }
Value f_upper(Interpreter&, const Value& v, CallArgs&) { return Value::string(py_upper(to_str(v))); }
Value f_capitalize(Interpreter&, const Value& v, CallArgs&) { return Value::string(py_capitalize(to_str(v))); }
// jinja2's do_title: words start after '-', whitespace, '(', '{', '[' or '<'.
Value f_title(Interpreter&, const Value& v, CallArgs&) {
  std::u32string u = utf8_decode(to_str(v));
  bool start = true;
  for (auto& c : u) {
    bool delim = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || py_isspace(c);
    if (delim) {
      start = true;
      continue;
    }
    std::string one;
    utf8_append(one, c);
    std::u32string conv = utf8_decode(start ? py_upper(one) : py_lower(one));
    if (conv.size() == 1) c = conv[0];
    start = false;
  }
  return Value::string(utf8_encode(u));
}
Value f_safe(Interpreter&, const Value& v, CallArgs&) { return Value::string(to_str(v)); }
Value f_escape(Interpreter&, const Value& v, CallArgs&) { return Value::string(html_escape(to_str(v))); }
Value f_pprint(Interpreter&, const Value& v, CallArgs&) { return Value::string(repr(v)); }

bool parse_number(std::string s, double& out, bool& integral, int64_t& iout, int base) {
  s = py_strip(s, nullptr, true, true);
  std::string t;
  for (char c : s)
    if (c != '_') t.push_back(c);
  if (t.empty()) return false;
  try {
    size_t used = 0;
    long long v = std::stoll(t, &used, base);
    if (used == t.size()) {
      integral = true;
      iout = v;
      return true;
    }
  } catch (...) {
  }
  if (base != 10) return false;
  try {
    size_t used = 0;
    double d = std::stod(t, &used);
    if (used == t.size()) {
      integral = false;
      out = d;
      return true;
    }
  } catch (...) {
  }
  return false;
}

Value f_int(Interpreter&, const Value& v, CallArgs& a) {
  Value def = a.get_or(0, "default", Value::integer(0));
  int base = static_cast<int>(to_int(a.get_or(1, "base", Value::integer(10))));
  switch (v.kind) {
    case K::Int: return v;
    case K::Bool: return Value::integer(v.b);
    case K::Float: return std::isfinite(v.f) ? Value::integer(static_cast<int64_t>(v.f)) : def;
    case K::String: {
      double d;
      bool integral;
      int64_t i;
      if (!parse_number(v.s, d, integral, i, base)) return def;
      return integral ? Value::integer(i) : Value::integer(static_cast<int64_t>(d));
    }
    default: return def;
  }
}

Value f_float(Interpreter&, const Value& v, CallArgs& a) {
  Value def = a.get_or(0, "default", Value::number(0.0));
  switch (v.kind) {
    case K::Int: return Value::number(static_cast<double>(v.i));
    case K::Bool: return Value::number(v.b);
    case K::Float: return v;
    case K::String: {
      double d;
      bool integral;
      int64_t i;
      std::string low = py_lower(py_strip(v.s, nullptr, true, true));
      if (low == "inf" || low == "+inf" || low == "infinity") return Value::number(INFINITY);
      if (low == "-inf" || low == "-infinity") return Value::number(-INFINITY);
      if (low == "nan") return Value::number(NAN);
      if (!parse_number(v.s, d, integral, i, 10)) return def;
      return Value::number(integral ? static_cast<double>(i) : d);
    }
    default: return def;
  }
}

Value f_items(Interpreter&, const Value& v, CallArgs&) {
  if (v.is_undefined()) return Value::new_list();
  if (v.kind != K::Dict) runtime_fail("Can only get item pairs from a mapping.");
  std::vector<Value> out;
  for (const auto& [k, val] : v.dict->items) out.push_back(Value::new_list({Value::string(k), val}, true));
  return Value::new_list(std::move(out));
}

Value f_join(Interpreter&, const Value& v, CallArgs& a) {
  std::string sep = to_str(a.get_or(0, "d", Value::string("")));
  const Value& attribute = arg(a, 1, "attribute", kNone);
  std::string out;
  bool first = true;
  for (const auto& e : iterate(v)) {
    if (!first) out += sep;
    first = false;
    out += to_str(attribute.is_none() ? e : attr_path(e, to_str(attribute)));
  }
  return Value::string(out);
}

Value f_default(Interpreter&, const Value& v, CallArgs& a) {
  Value def = a.get_or(0, "default_value", Value::string(""));
  bool boolean = arg(a, 1, "boolean", kFalse).truthy();
  if (v.is_undefined() || (boolean && !v.truthy())) return def;
  return v;
}

Value f_first(Interpreter&, const Value& v, CallArgs&) {
  auto items = iterate(v);
  if (items.empty()) return Value::undefined("No first item, sequence was empty.");
  return items.front();
}
Value f_last(Interpreter&, const Value& v, CallArgs&) {
  if (v.kind == K::Dict) runtime_fail("'dict' object is not reversible");
  auto items = iterate(v);
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
}

bool run_test(Interpreter& in, const Value& v, const std::string& name, CallArgs& a) {
  TestFn t = find_test(name);
  if (!t) runtime_fail("No test named '" + name + "'.");
  return t(in, v, a);
}

Value select_impl(Interpreter& in, const Value& v, CallArgs& a, bool by_attr, bool keep) {
  size_t pos = 0;
  std::string attribute;
  if (by_attr) {
    if (a.args.empty()) runtime_fail("Missing parameter for attribute name");
    attribute = to_str(a.args[0]);
    pos = 1;
  }
  std::string test;
  CallArgs targs;
  if (a.args.size() > pos) {
    test = to_str(a.args[pos]);
    targs.args.assign(a.args.begin() + static_cast<long>(pos) + 1, a.args.end());
    targs.kwargs = a.kwargs;
  }
  std::vector<Value> out;
  for (const auto& e : iterate(v)) {
    Value x = by_attr ? attr_path(e, attribute) : e;
    bool ok = test.empty() ? x.truthy() : run_test(in, x, test, targs);
    if (ok == keep) out.push_back(e);
  }
  return Value::new_list(std::move(out));
}
Value f_selectattr(Interpreter& in, const Value& v, CallArgs& a) { return select_impl(in, v, a, true, true); }
Value f_rejectattr(Interpreter& in, const Value& v, CallArgs& a) { return select_impl(in, v, a, true, false); }
Value f_select(Interpreter& in, const Value& v, CallArgs& a) { return select_impl(in, v, a, false, true); }
Value f_reject(Interpreter& in, const Value& v, CallArgs& a) { return select_impl(in, v, a, false, false); }

Value f_map(Interpreter& in, const Value& v, CallArgs& a) {
  std::vector<Value> out;
  const Value* attribute = a.get(99, "attribute");
  if (attribute) {
    const Value* def = a.get(99, "default");
    for (const auto& e : iterate(v)) {
      Value x = attr_path(e, to_str(*attribute));
      out.push_back(x.is_undefined() && def ? *def : x);
    }
    return Value::new_list(std::move(out));
  }
  if (a.args.empty()) runtime_fail("map requires a filter argument");
  std::string name = to_str(a.args[0]);
  FilterFn f = find_filter(name);
  if (!f) runtime_fail("No filter named '" + name + "'.");
  CallArgs fa;
  fa.args.assign(a.args.begin() + 1, a.args.end());
  fa.kwargs = a.kwargs;
  for (const auto& e : iterate(v)) out.push_back(f(in, e, fa));
  return Value::new_list(std::move(out));
}

Value f_replace(Interpreter&, const Value& v, CallArgs& a) {
  if (a.args.size() < 2 && a.kwargs.empty()) runtime_fail("replace() requires old and new");
  std::string old = to_str(arg(a, 0, "old", kNone)), rep = to_str(arg(a, 1, "new", kNone));
  const Value& count = arg(a, 2, "count", kNone);
  return Value::string(py_replace(to_str(v), old, rep, count.is_none() ? -1 : to_int(count)));
}

Value f_list(Interpreter&, const Value& v, CallArgs&) { return Value::new_list(iterate(v)); }

Value f_unique(Interpreter&, const Value& v, CallArgs& a) {
  bool cs = arg(a, 0, "case_sensitive", kFalse).truthy();
  const Value& attribute = arg(a, 1, "attribute", kNone);
  std::vector<Value> out, seen;
  for (const auto& e : iterate(v)) {
    Value key = sort_key(attribute.is_none() ? e : attr_path(e, to_str(attribute)), cs);
    bool dup = false;
    for (const auto& s : seen)
      if (equals(s, key)) dup = true;
    if (!dup) {
      seen.push_back(key);
      out.push_back(e);
    }
  }
  return Value::new_list(std::move(out));
}

Value f_sort(Interpreter&, const Value& v, CallArgs& a) {
  bool reverse = arg(a, 0, "reverse", kFalse).truthy();
  bool cs = arg(a, 1, "case_sensitive", kFalse).truthy();
  const Value& attribute = arg(a, 2, "attribute", kNone);
  auto items = iterate(v);
  std::vector<std::pair<Value, Value>> keyed;
  for (const auto& e : items)
    keyed.emplace_back(sort_key(attribute.is_none() ? e : attr_path(e, to_str(attribute)), cs), e);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    return reverse ? less_than(y.first, x.first) : less_than(x.first, y.first);
  });
  std::vector<Value> out;
  for (auto& kv : keyed) out.push_back(kv.second);
  return Value::new_list(std::move(out));
}

Value f_dictsort(Interpreter&, const Value& v, CallArgs& a) {
  if (v.kind != K::Dict) runtime_fail("You can only sort by either \"key\" or \"value\"");
  bool cs = arg(a, 0, "case_sensitive", kFalse).truthy();
  std::string by = to_str(a.get_or(1, "by", Value::string("key")));
  bool reverse = arg(a, 2, "reverse", kFalse).truthy();
  size_t pos = by == "key" ? 0 : by == "value" ? 1 : 2;
  if (pos == 2) runtime_fail("You can only sort by either \"key\" or \"value\"");
  std::vector<Value> items;
  for (const auto& [k, val] : v.dict->items) items.push_back(Value::new_list({Value::string(k), val}, true));
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    Value kx = sort_key(x.list->items[pos], cs), ky = sort_key(y.list->items[pos], cs);
    return reverse ? less_than(ky, kx) : less_than(kx, ky);
  });
  return Value::new_list(std::move(items));
}

Value f_reverse(Interpreter&, const Value& v, CallArgs&) {
  if (v.is_string()) {
    std::u32string u = utf8_decode(v.s);
    std::reverse(u.begin(), u.end());
    return Value::string(utf8_encode(u));
  }
  auto items = iterate(v);
  std::reverse(items.begin(), items.end());
  return Value::new_list(std::move(items));
}

Value f_abs(Interpreter&, const Value& v, CallArgs&) {
  if (v.kind == K::Float) return Value::number(std::fabs(v.f));
  if (is_int(v)) return Value::integer(std::llabs(to_int(v)));
  runtime_fail("bad operand type for abs(): '" + v.type_name() + "'");
}

double round_half_even(double x) {
  double r = std::nearbyint(x);  // default rounding mode is to-nearest-even
  return r;
}

Value f_round(Interpreter&, const Value& v, CallArgs& a) {
  int64_t precision = to_int(a.get_or(0, "precision", Value::integer(0)));
  std::string method = to_str(a.get_or(1, "method", Value::string("common")));
  double x = v.as_double(), scale = std::pow(10.0, static_cast<double>(precision));
  if (method == "common") return Value::number(round_half_even(x * scale) / scale);
  if (method == "floor") return Value::number(std::floor(x * scale) / scale);
  if (method == "ceil") return Value::number(std::ceil(x * scale) / scale);
  runtime_fail("method must be common, ceil or floor");
}

Value f_indent(Interpreter&, const Value& v, CallArgs& a) {
  Value width = a.get_or(0, "width", Value::integer(4));
  bool first = arg(a, 1, "first", kFalse).truthy(), blank = arg(a, 2, "blank", kFalse).truthy();
  std::string ind = width.is_string() ? width.s : std::string(static_cast<size_t>(std::max<int64_t>(0, to_int(width))), ' ');
  std::string s = to_str(v) + "\n";
  auto lines = split_lines(s, false);
  std::string rv;
  if (blank) {
    for (size_t k = 0; k < lines.size(); ++k) rv += (k ? "\n" + ind : "") + lines[k];
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t k = 1; k < lines.size(); ++k) rv += "\n" + (lines[k].empty() ? lines[k] : ind + lines[k]);
  }
  if (first) rv = ind + rv;
  return Value::string(rv);
}

Value f_wordcount(Interpreter&, const Value& v, CallArgs&) {
  int64_t n = 0;
  bool in_word = false;
  for (char32_t c : utf8_decode(to_str(v))) {
    bool w = c == '_' || (c < 0x80 ? std::isalnum(static_cast<int>(c)) != 0 : !py_isspace(c));
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value::integer(n);
}

Value f_batch(Interpreter&, const Value& v, CallArgs& a) {
  int64_t count = to_int(arg(a, 0, "linecount", Value::integer(1)));
  if (count <= 0) runtime_fail("batch size must be positive");
  const Value* fill = a.get(1, "fill_with");
  std::vector<Value> out, cur;
  for (const auto& e : iterate(v)) {
    cur.push_back(e);
    if (static_cast<int64_t>(cur.size()) == count) {
      out.push_back(Value::new_list(std::move(cur)));
      cur.clear();
    }
  }
  if (!cur.empty()) {
    if (fill && !fill->is_none())
      while (static_cast<int64_t>(cur.size()) < count) cur.push_back(*fill);
    out.push_back(Value::new_list(std::move(cur)));
  }
  return Value::new_list(std::move(out));
}

Value minmax(const Value& v, CallArgs& a, bool want_max) {
  bool cs = arg(a, 0, "case_sensitive", kFalse).truthy();
  const Value& attribute = arg(a, 1, "attribute", kNone);
  auto items = iterate(v);
  if (items.empty()) return Value::undefined(std::string("No aggregated item, sequence was empty."));
  size_t best = 0;
  auto key = [&](size_t k) { return sort_key(attribute.is_none() ? items[k] : attr_path(items[k], to_str(attribute)), cs); };
  for (size_t k = 1; k < items.size(); ++k) {
    if (want_max ? less_than(key(best), key(k)) : less_than(key(k), key(best))) best = k;
  }
  return items[best];
}
Value f_min(Interpreter&, const Value& v, CallArgs& a) { return minmax(v, a, false); }
Value f_max(Interpreter&, const Value& v, CallArgs& a) { return minmax(v, a, true); }

Value f_sum(Interpreter&, const Value& v, CallArgs& a) {
  const Value& attribute = arg(a, 0, "attribute", kNone);
  Value total = a.get_or(1, "start", Value::integer(0));
  for (const auto& e : iterate(v)) total = binary_op("+", total, attribute.is_none() ? e : attr_path(e, to_str(attribute)));
  return total;
}

// jinja2's attr filter only looks up Python attributes (methods, namespace fields), never dict keys.
Value f_attr(Interpreter&, const Value& v, CallArgs& a) {
  std::string name = to_str(arg(a, 0, "name", kNone));
  if (v.is_undefined()) undefined_fail(v);
  if (v.kind == K::Namespace) return get_attr(v, name);
  Value m = get_method(v, name);
  if (!m.is_undefined()) return m;
  return Value::undefined("'" + v.type_name() + " object' has no attribute '" + name + "'");
}

Value f_format(Interpreter&, const Value& v, CallArgs& a) {
  if (!a.kwargs.empty()) runtime_fail("format with keyword arguments is not supported");
  return binary_op("%", Value::string(to_str(v)), Value::new_list(a.args, true));
}

Value f_center(Interpreter&, const Value& v, CallArgs& a) {
  std::u32string u = utf8_decode(to_str(v));
  int64_t width = to_int(a.get_or(0, "width", Value::integer(80)));
  if (static_cast<int64_t>(u.size()) >= width) return Value::string(to_str(v));
  size_t pad = static_cast<size_t>(width) - u.size(), left = pad / 2 + (pad & static_cast<size_t>(width) & 1);
  return Value::string(std::string(left, ' ') + to_str(v) + std::string(pad - left, ' '));
}

const std::map<std::string, FilterFn>& filters() {
  static const std::map<std::string, FilterFn> m = {
      {"tojson", f_tojson},     {"trim", f_trim},         {"length", f_length},     {"count", f_length},
      {"string", f_string},     {"int", f_int},           {"float", f_float},       {"lower", f_lower},
      {"upper", f_upper},       {"capitalize", f_capitalize}, {"title", f_title},   {"items", f_items},
      {"join", f_join},         {"default", f_default},   {"d", f_default},         {"first", f_first},
      {"last", f_last},         {"selectattr", f_selectattr}, {"rejectattr", f_rejectattr}, {"map", f_map},
      {"select", f_select},     {"reject", f_reject},     {"replace", f_replace},   {"list", f_list},
      {"unique", f_unique},     {"sort", f_sort},         {"reverse", f_reverse},   {"abs", f_abs},
      {"round", f_round},       {"safe", f_safe},         {"e", f_escape},          {"escape", f_escape},
      {"indent", f_indent},     {"wordcount", f_wordcount}, {"batch", f_batch},     {"dictsort", f_dictsort},
      {"min", f_min},           {"max", f_max},           {"sum", f_sum},           {"attr", f_attr},
      {"format", f_format},     {"pprint", f_pprint},     {"center", f_center},     {"forceescape", f_escape},
  };
  return m;
}

}  // namespace

FilterFn find_filter(const std::string& name) {
  auto it = filters().find(name);
  return it == filters().end() ? nullptr : it->second;
}

}  // namespace fathom::chat
