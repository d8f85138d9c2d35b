#include "chat/builtins.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <map>

#include "chat/interpreter.h"
#include "chat/text.h"

namespace fathom::chat {
namespace {

using K = Value::Kind;

bool is_int(const Value& v) { return v.kind == K::Int || v.kind == K::Bool; }
int64_t to_int(const Value& v) { return v.kind == K::Bool ? v.b : v.i; }

int64_t length_of(const Value& v) {
  switch (v.kind) {
    case K::Undefined: return 0;
    case K::String: return static_cast<int64_t>(utf8_length(v.s));
    case K::List: return static_cast<int64_t>(v.list->items.size());
    case K::Dict: return static_cast<int64_t>(v.dict->items.size());
    default: runtime_fail("object of type '" + v.type_name() + "' has no len()");
  }
}

const Value& arg(CallArgs& a, size_t pos, const char* name, const Value& fallback) {
  const Value* v = a.get(pos, name);
  return v ? *v : fallback;
}
const Value kNone = Value::none();
const Value kFalse = Value::boolean(false);

std::string need_str(const Value& v, const char* what) {
  if (v.is_undefined()) undefined_fail(v);
  if (!v.is_string()) runtime_fail(std::string(what) + " must be str, not " + v.type_name());
  return v.s;
}

// jinja2's make_attrgetter: dotted path, integer parts index sequences.
Value attr_path(const Value& obj, const std::string& path) {
  Value cur = obj;
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
    cur = digits ? get_item(cur, Value::integer(std::stoll(part))) : get_item(cur, Value::string(part));
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

Value sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::string(py_lower(v.s));
  return v;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

std::vector<std::string> split_lines(const std::string& s, bool keepends) {
  std::vector<std::string> lines;
  std::u32string u = utf8_decode(s);
  std::u32string curl;
  for (size_t k = 0; k < u.size(); ++k) {
    char32_t c = u[k];
    bool brk = c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e || c == 0x85 ||
               c == 0x2028 || c == 0x2029;
    if (!brk) {
      curl.push_back(c);
      continue;
    }
    if (keepends) curl.push_back(c);
    if (c == '\r' && k + 1 < u.size() && u[k + 1] == '\n') {
      if (keepends) curl.push_back('\n');
      ++k;
    }
    lines.push_back(utf8_encode(curl));
    curl.clear();
  }
  if (!curl.empty()) lines.push_back(utf8_encode(curl));
  return lines;
}

// ---------------- filters ----------------

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

// ---------------- tests ----------------

const Value& test_arg(CallArgs& a) {
  if (a.args.empty()) runtime_fail("test requires an argument");
  return a.args[0];
}

bool t_defined(Interpreter&, const Value& v, CallArgs&) { return !v.is_undefined(); }
bool t_undefined(Interpreter&, const Value& v, CallArgs&) { return v.is_undefined(); }
bool t_none(Interpreter&, const Value& v, CallArgs&) { return v.is_none(); }
bool t_string(Interpreter&, const Value& v, CallArgs&) { return v.is_string(); }
bool t_number(Interpreter&, const Value& v, CallArgs&) { return v.is_number(); }
bool t_integer(Interpreter&, const Value& v, CallArgs&) { return v.kind == K::Int; }
bool t_float(Interpreter&, const Value& v, CallArgs&) { return v.kind == K::Float; }
bool t_boolean(Interpreter&, const Value& v, CallArgs&) { return v.kind == K::Bool; }
bool t_mapping(Interpreter&, const Value& v, CallArgs&) { return v.kind == K::Dict; }
bool t_sequence(Interpreter&, const Value& v, CallArgs&) {
  return v.kind == K::String || v.kind == K::List || v.kind == K::Dict || v.kind == K::Undefined;
}
bool t_iterable(Interpreter&, const Value& v, CallArgs&) {
  return v.kind == K::String || v.kind == K::List || v.kind == K::Dict || v.kind == K::Undefined;
}
bool t_callable(Interpreter&, const Value& v, CallArgs&) { return v.kind == K::Callable; }
bool t_true(Interpreter&, const Value& v, CallArgs&) { return v.kind == K::Bool && v.b; }
bool t_false(Interpreter&, const Value& v, CallArgs&) { return v.kind == K::Bool && !v.b; }
bool t_in(Interpreter&, const Value& v, CallArgs& a) { return contains(test_arg(a), v); }
bool t_eq(Interpreter&, const Value& v, CallArgs& a) { return equals(v, test_arg(a)); }
bool t_ne(Interpreter&, const Value& v, CallArgs& a) { return !equals(v, test_arg(a)); }
bool t_lt(Interpreter&, const Value& v, CallArgs& a) { return less_than(v, test_arg(a)); }
bool t_gt(Interpreter&, const Value& v, CallArgs& a) { return less_than(test_arg(a), v); }
bool t_le(Interpreter&, const Value& v, CallArgs& a) { return less_than(v, test_arg(a)) || equals(v, test_arg(a)); }
bool t_ge(Interpreter&, const Value& v, CallArgs& a) { return less_than(test_arg(a), v) || equals(v, test_arg(a)); }
int64_t int_operand(const Value& v) {
  if (v.is_undefined()) undefined_fail(v);
  if (!is_int(v)) runtime_fail("expected an integer, got " + v.type_name());
  return to_int(v);
}
bool t_odd(Interpreter&, const Value& v, CallArgs&) { return (int_operand(v) % 2 + 2) % 2 == 1; }
bool t_even(Interpreter&, const Value& v, CallArgs&) { return int_operand(v) % 2 == 0; }
bool t_divisibleby(Interpreter&, const Value& v, CallArgs& a) {
  int64_t d = int_operand(test_arg(a));
  if (d == 0) runtime_fail("integer division or modulo by zero");
  return int_operand(v) % d == 0;
}
bool t_sameas(Interpreter&, const Value& v, CallArgs& a) {
  const Value& o = test_arg(a);
  if (v.kind != o.kind) return false;
  switch (v.kind) {
    case K::None:
    case K::Undefined: return true;
    case K::Bool: return v.b == o.b;
    case K::Int: return v.i == o.i && v.i >= -5 && v.i <= 256;
    case K::List: return v.list == o.list;
    case K::Dict:
    case K::Namespace: return v.dict == o.dict;
    case K::Callable: return v.fn == o.fn;
    default: return false;
  }
}
bool t_lower(Interpreter&, const Value& v, CallArgs&) { std::string s = to_str(v); return py_lower(s) == s && py_upper(s) != s; }
bool t_upper(Interpreter&, const Value& v, CallArgs&) { std::string s = to_str(v); return py_upper(s) == s && py_lower(s) != s; }
bool t_escaped(Interpreter&, const Value&, CallArgs&) { return false; }
bool t_filter(Interpreter&, const Value& v, CallArgs&) { return v.is_string() && find_filter(v.s) != nullptr; }
bool t_test(Interpreter&, const Value& v, CallArgs&) { return v.is_string() && find_test(v.s) != nullptr; }

const std::map<std::string, TestFn>& tests() {
  static const std::map<std::string, TestFn> m = {
      {"defined", t_defined}, {"undefined", t_undefined}, {"none", t_none}, {"string", t_string},
      {"number", t_number}, {"integer", t_integer}, {"float", t_float}, {"boolean", t_boolean},
      {"mapping", t_mapping}, {"sequence", t_sequence}, {"iterable", t_iterable}, {"callable", t_callable},
      {"true", t_true}, {"false", t_false}, {"in", t_in}, {"eq", t_eq}, {"equalto", t_eq}, {"==", t_eq},
      {"ne", t_ne}, {"!=", t_ne}, {"lt", t_lt}, {"<", t_lt}, {"lessthan", t_lt}, {"le", t_le}, {"<=", t_le},
      {"gt", t_gt}, {">", t_gt}, {"greaterthan", t_gt}, {"ge", t_ge}, {">=", t_ge}, {"odd", t_odd},
      {"even", t_even}, {"divisibleby", t_divisibleby}, {"sameas", t_sameas}, {"lower", t_lower},
      {"upper", t_upper}, {"escaped", t_escaped}, {"filter", t_filter}, {"test", t_test},
  };
  return m;
}

// ---------------- methods ----------------

std::vector<std::string> py_split(const std::string& s, const Value& sep, int64_t maxsplit, bool from_right) {
  std::vector<std::string> parts;
  if (sep.is_none()) {
    std::u32string u = utf8_decode(s);
    std::vector<std::u32string> words;
    if (!from_right) {
      size_t k = 0;
      while (k < u.size()) {
        while (k < u.size() && py_isspace(u[k])) ++k;
        if (k >= u.size()) break;
        if (maxsplit >= 0 && static_cast<int64_t>(words.size()) == maxsplit) {
          words.push_back(u.substr(k));
          break;
        }
        size_t e = k;
        while (e < u.size() && !py_isspace(u[e])) ++e;
        words.push_back(u.substr(k, e - k));
        k = e;
      }
    } else {
      int64_t k = static_cast<int64_t>(u.size());
      while (k > 0) {
        while (k > 0 && py_isspace(u[static_cast<size_t>(k - 1)])) --k;
        if (k <= 0) break;
        if (maxsplit >= 0 && static_cast<int64_t>(words.size()) == maxsplit) {
          words.push_back(u.substr(0, static_cast<size_t>(k)));
          break;
        }
        int64_t b = k;
        while (b > 0 && !py_isspace(u[static_cast<size_t>(b - 1)])) --b;
        words.push_back(u.substr(static_cast<size_t>(b), static_cast<size_t>(k - b)));
        k = b;
      }
      std::reverse(words.begin(), words.end());
    }
    for (auto& w : words) parts.push_back(utf8_encode(w));
    return parts;
  }
  std::string d = need_str(sep, "separator");
  if (d.empty()) runtime_fail("empty separator");
  if (!from_right) {
    size_t pos = 0;
    while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
      size_t hit = s.find(d, pos);
      if (hit == std::string::npos) break;
      parts.push_back(s.substr(pos, hit - pos));
      pos = hit + d.size();
    }
    parts.push_back(s.substr(pos));
  } else {
    size_t end = s.size();
    std::vector<std::string> rev;
    while (maxsplit < 0 || static_cast<int64_t>(rev.size()) < maxsplit) {
      if (end < d.size()) break;
      size_t hit = s.rfind(d, end - d.size());
      if (hit == std::string::npos) break;
      rev.push_back(s.substr(hit + d.size(), end - hit - d.size()));
      end = hit;
    }
    rev.push_back(s.substr(0, end));
    parts.assign(rev.rbegin(), rev.rend());
  }
  return parts;
}

Value str_list(const std::vector<std::string>& v) {
  std::vector<Value> out;
  for (const auto& s : v) out.push_back(Value::string(s));
  return Value::new_list(std::move(out));
}

bool affix_match(const std::string& s, const Value& affix, bool prefix) {
  std::vector<Value> options = affix.is_list() ? affix.list->items : std::vector<Value>{affix};
  for (const auto& o : options) {
    std::string a = need_str(o, prefix ? "startswith arg" : "endswith arg");
    if (a.size() <= s.size() && (prefix ? s.compare(0, a.size(), a) == 0 : s.compare(s.size() - a.size(), a.size(), a) == 0))
      return true;
  }
  return false;
}

int64_t cp_index(const std::string& s, size_t byte) {
  return byte == std::string::npos ? -1 : static_cast<int64_t>(utf8_length(std::string_view(s).substr(0, byte)));
}

std::string str_format(const std::string& fmt, CallArgs& a) {
  std::string out;
  size_t auto_idx = 0;
  for (size_t k = 0; k < fmt.size(); ++k) {
    char c = fmt[k];
    if (c == '{') {
      if (k + 1 < fmt.size() && fmt[k + 1] == '{') {
        out.push_back('{');
        ++k;
        continue;
      }
      size_t e = fmt.find('}', k);
      if (e == std::string::npos) runtime_fail("Single '{' encountered in format string");
      std::string field = fmt.substr(k + 1, e - k - 1);
      if (field.find(':') != std::string::npos || field.find('!') != std::string::npos)
        runtime_fail("format specs are not supported");
      Value v;
      if (field.empty()) {
        if (auto_idx >= a.args.size()) runtime_fail("Replacement index out of range");
        v = a.args[auto_idx++];
      } else if (std::all_of(field.begin(), field.end(), [](char ch) { return std::isdigit(static_cast<unsigned char>(ch)); })) {
        size_t i = std::stoul(field);
        if (i >= a.args.size()) runtime_fail("Replacement index out of range");
        v = a.args[i];
      } else {
        const Value* kv = a.get(SIZE_MAX, field.c_str());
        if (!kv) runtime_fail("KeyError: '" + field + "'");
        v = *kv;
      }
      out += to_str(v);
      k = e;
    } else if (c == '}') {
      if (k + 1 < fmt.size() && fmt[k + 1] == '}') ++k;
      else runtime_fail("Single '}' encountered in format string");
      out.push_back('}');
    } else {
      out.push_back(c);
    }
  }
  return out;
}

Value string_method(const std::string& s, const std::string& name, CallArgs& a) {
  auto opt_str = [&](size_t pos, const char* kw) -> std::optional<std::string> {
    const Value* v = a.get(pos, kw);
    if (!v || v->is_none()) return std::nullopt;
    return need_str(*v, "argument");
  };
  if (name == "startswith" || name == "endswith") {
    if (a.args.empty()) runtime_fail(name + "() takes at least 1 argument (0 given)");
    std::u32string u = utf8_decode(s);
    int64_t n = static_cast<int64_t>(u.size());
    int64_t b = a.args.size() > 1 && !a.args[1].is_none() ? to_int(a.args[1]) : 0;
    int64_t e = a.args.size() > 2 && !a.args[2].is_none() ? to_int(a.args[2]) : n;
    if (b < 0) b = std::max<int64_t>(0, b + n);
    if (e < 0) e = std::max<int64_t>(0, e + n);
    b = std::min(b, n);
    e = std::min(e, n);
    std::string sub = b <= e ? utf8_encode(std::u32string_view(u).substr(static_cast<size_t>(b), static_cast<size_t>(e - b))) : "";
    if (b > e) return Value::boolean(false);
    return Value::boolean(affix_match(sub, a.args[0], name == "startswith"));
  }
  if (name == "split" || name == "rsplit") {
    Value sep = a.get_or(0, "sep", Value::none());
    int64_t maxsplit = to_int(a.get_or(1, "maxsplit", Value::integer(-1)));
    return str_list(py_split(s, sep, maxsplit, name == "rsplit"));
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    auto chars = opt_str(0, "chars");
    return Value::string(py_strip(s, chars ? &*chars : nullptr, name != "rstrip", name != "lstrip"));
  }
  if (name == "replace") {
    if (a.args.size() < 2) runtime_fail("replace expected at least 2 arguments");
    int64_t count = a.args.size() > 2 ? to_int(a.args[2]) : to_int(a.get_or(99, "count", Value::integer(-1)));
    return Value::string(py_replace(s, need_str(a.args[0], "old"), need_str(a.args[1], "new"), count));
  }
  if (name == "lower") return Value::string(py_lower(s));
  if (name == "upper") return Value::string(py_upper(s));
  if (name == "title") return Value::string(py_title(s));
  if (name == "capitalize") return Value::string(py_capitalize(s));
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    if (a.args.empty()) runtime_fail(name + "() takes at least 1 argument (0 given)");
    std::string sub = need_str(a.args[0], "substring");
    if (name == "count") {
      if (sub.empty()) return Value::integer(static_cast<int64_t>(utf8_length(s)) + 1);
      int64_t n = 0;
      for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
      return Value::integer(n);
    }
    size_t hit = (name == "find" || name == "index") ? s.find(sub) : s.rfind(sub);
    if (hit == std::string::npos && (name == "index" || name == "rindex")) runtime_fail("substring not found");
    return Value::integer(cp_index(s, hit));
  }
  if (name == "format") return Value::string(str_format(s, a));
  if (name == "join") {
    if (a.args.empty()) runtime_fail("join() takes exactly one argument (0 given)");
    std::string out;
    bool first = true;
    for (const auto& e : iterate(a.args[0])) {
      if (!first) out += s;
      first = false;
      out += need_str(e, "sequence item");
    }
    return Value::string(out);
  }
  if (name == "splitlines") return str_list(split_lines(s, a.get_or(0, "keepends", Value::boolean(false)).truthy()));
  if (name == "removeprefix" || name == "removesuffix") {
    std::string x = a.args.empty() ? "" : need_str(a.args[0], "argument");
    bool pre = name == "removeprefix";
    if (x.size() <= s.size() && (pre ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0))
      return Value::string(pre ? s.substr(x.size()) : s.substr(0, s.size() - x.size()));
    return Value::string(s);
  }
  auto all_of = [&](auto pred) {
    std::u32string u = utf8_decode(s);
    if (u.empty()) return Value::boolean(false);
    for (char32_t c : u)
      if (!pred(c)) return Value::boolean(false);
    return Value::boolean(true);
  };
  if (name == "isdigit") return all_of([](char32_t c) { return c >= '0' && c <= '9'; });
  if (name == "isspace") return all_of([](char32_t c) { return py_isspace(c); });
  if (name == "isalpha") return all_of([](char32_t c) { return c >= 0x80 || std::isalpha(static_cast<int>(c)); });
  if (name == "isalnum") return all_of([](char32_t c) { return c >= 0x80 || std::isalnum(static_cast<int>(c)); });
  if (name == "islower") return Value::boolean(py_lower(s) == s && py_upper(s) != s);
  if (name == "isupper") return Value::boolean(py_upper(s) == s && py_lower(s) != s);
  runtime_fail("'str' object has no attribute '" + name + "'");
}

bool is_string_method(const std::string& n) {
  static const char* names[] = {"startswith", "endswith", "split", "rsplit", "strip", "lstrip", "rstrip", "replace",
                                "lower", "upper", "title", "capitalize", "find", "rfind", "index", "rindex", "count",
                                "format", "join", "splitlines", "removeprefix", "removesuffix", "isdigit", "isspace",
                                "isalpha", "isalnum", "islower", "isupper"};
  for (const char* x : names)
    if (n == x) return true;
  return false;
}

}  // namespace

FilterFn find_filter(const std::string& name) {
  auto it = filters().find(name);
  return it == filters().end() ? nullptr : it->second;
}

TestFn find_test(const std::string& name) {
  auto it = tests().find(name);
  return it == tests().end() ? nullptr : it->second;
}

Value get_method(const Value& obj, const std::string& name) {
  if (obj.is_string()) {
    if (!is_string_method(name)) return Value::undefined();
    std::string s = obj.s;
    return Value::callable(name, [s, name](Interpreter&, CallArgs& a) { return string_method(s, name, a); });
  }
  if (obj.kind == K::Dict) {
    Value d = obj;
    if (name == "items" || name == "keys" || name == "values") {
      return Value::callable(name, [d, name](Interpreter&, CallArgs&) {
        std::vector<Value> out;
        for (const auto& [k, v] : d.dict->items) {
          if (name == "items") out.push_back(Value::new_list({Value::string(k), v}, true));
          else out.push_back(name == "keys" ? Value::string(k) : v);
        }
        return Value::new_list(std::move(out));
      });
    }
    if (name == "get") {
      return Value::callable(name, [d](Interpreter&, CallArgs& a) {
        if (a.args.empty()) runtime_fail("get expected at least 1 argument, got 0");
        Value def = a.args.size() > 1 ? a.args[1] : Value::none();
        if (!a.args[0].is_string()) return def;
        const Value* v = d.dict->find(a.args[0].s);
        return v ? *v : def;
      });
    }
    if (name == "copy") {
      return Value::callable(name, [d](Interpreter&, CallArgs&) {
        Value c = Value::new_dict();
        *c.dict = *d.dict;
        return c;
      });
    }
    if (name == "update" || name == "pop" || name == "popitem" || name == "clear" || name == "setdefault") {
      return Value::callable(name, [name](Interpreter&, CallArgs&) -> Value {
        runtime_fail("access to attribute '" + name + "' of 'dict' object is unsafe.");
      });
    }
    return Value::undefined();
  }
  if (obj.kind == K::List) {
    Value l = obj;
    if (name == "index" || name == "count") {
      return Value::callable(name, [l, name](Interpreter&, CallArgs& a) {
        if (a.args.empty()) runtime_fail(name + "() takes exactly one argument (0 given)");
        int64_t n = 0;
        for (size_t k = 0; k < l.list->items.size(); ++k) {
          if (equals(l.list->items[k], a.args[0])) {
            if (name == "index") return Value::integer(static_cast<int64_t>(k));
            ++n;
          }
        }
        if (name == "index") runtime_fail(repr(a.args[0]) + " is not in list");
        return Value::integer(n);
      });
    }
    if (name == "copy") return Value::callable(name, [l](Interpreter&, CallArgs&) { return Value::new_list(l.list->items); });
    if (!l.tuple && (name == "append" || name == "extend" || name == "insert" || name == "pop" || name == "remove" ||
                     name == "reverse" || name == "sort" || name == "clear")) {
      return Value::callable(name, [name](Interpreter&, CallArgs&) -> Value {
        runtime_fail("access to attribute '" + name + "' of 'list' object is unsafe.");
      });
    }
  }
  return Value::undefined();
}

void install_globals(Value& g) {
  g.dict->set("raise_exception", Value::callable("raise_exception", [](Interpreter&, CallArgs& a) -> Value {
                runtime_fail(a.args.empty() ? std::string() : to_str(a.args[0]));
              }));
  g.dict->set("strftime_now", Value::callable("strftime_now", [](Interpreter&, CallArgs& a) -> Value {
                std::string fmt = a.args.empty() ? "" : to_str(a.args[0]);
                std::time_t t = std::time(nullptr);
                std::tm tm{};
                localtime_r(&t, &tm);
                char buf[512];
                size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
                return Value::string(std::string(buf, n));
              }));
  g.dict->set("namespace", Value::callable("namespace", [](Interpreter&, CallArgs& a) -> Value {
                Value ns = Value::new_namespace();
                for (const auto& p : a.args) {
                  if (p.kind != K::Dict) runtime_fail("namespace() positional argument must be a mapping");
                  for (const auto& [k, v] : p.dict->items) ns.dict->set(k, v);
                }
                for (const auto& [k, v] : a.kwargs) ns.dict->set(k, v);
                return ns;
              }));
  g.dict->set("dict", Value::callable("dict", [](Interpreter&, CallArgs& a) -> Value {
                Value d = Value::new_dict();
                for (const auto& p : a.args) {
                  if (p.kind != K::Dict) runtime_fail("dict() positional argument must be a mapping");
                  for (const auto& [k, v] : p.dict->items) d.dict->set(k, v);
                }
                for (const auto& [k, v] : a.kwargs) d.dict->set(k, v);
                return d;
              }));
  g.dict->set("range", Value::callable("range", [](Interpreter&, CallArgs& a) -> Value {
                if (a.args.empty() || a.args.size() > 3) runtime_fail("range expected 1 to 3 arguments");
                for (const auto& x : a.args)
                  if (!is_int(x)) runtime_fail("'" + x.type_name() + "' object cannot be interpreted as an integer");
                int64_t start = 0, stop, step = 1;
                if (a.args.size() == 1) stop = to_int(a.args[0]);
                else {
                  start = to_int(a.args[0]);
                  stop = to_int(a.args[1]);
                  if (a.args.size() == 3) step = to_int(a.args[2]);
                }
                if (step == 0) runtime_fail("range() arg 3 must not be zero");
                std::vector<Value> out;
                for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
                  if (out.size() >= 100000) runtime_fail("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
                  out.push_back(Value::integer(k));
                }
                return Value::new_list(std::move(out));
              }));
}

}  // namespace fathom::chat
