// Python str / dict / list methods reachable from templates (getattr on a value).
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

}  // namespace fathom::chat
