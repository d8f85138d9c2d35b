// Strings: minLength/maxLength, pattern (ECMA-262 search semantics) and format.
#include <map>

#include "core/error.h"
#include "grammar/intersection.h"
#include "grammar/regex.h"
#include "grammar/schema_compiler.h"

namespace fathom::grammar::schema {

namespace {

struct Format {
  const char* regex;  // whole match; a subset of what Python jsonschema's format checker accepts
  int min_len, max_len;  // -1: unbounded
};

#define DAY31 "(0[1-9]|[12][0-9]|3[01])"
// February 29 in leap years: divisible by 4 and not by 100 (last two digits 04, 08, 12, ... 96),
// or by 400 (centuries 12, 16, 20, 24, ...).
#define LEAP_YEAR "([1-9][0-9](0[48]|[2468][048]|[13579][26])|([2468][048]|[13579][26])00)"
#define DATE                                                                                      \
  "([1-9][0-9]{3}-(0[13578]|1[02])-" DAY31 "|[1-9][0-9]{3}-(0[469]|11)-(0[1-9]|[12][0-9]|30)|[1-9][0-9]{3}-02-" \
  "(0[1-9]|1[0-9]|2[0-8])|" LEAP_YEAR "-02-29)"
// RFC 3339 takes T and Z in either case (5.6, note).
#define TIME "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
// RFC 1123 host names: labels of letters, digits and inner hyphens, either case, the name under
// 253 characters: up to 3 labels of up to 63, or up to 6 of up to 40.
#define LABEL "[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?"
#define SHORT_LABEL "[a-zA-Z0-9]([a-zA-Z0-9-]{0,38}[a-zA-Z0-9])?"
#define HOST "((" LABEL "\\.){0,2}" LABEL "|(" SHORT_LABEL "\\.){3,5}" SHORT_LABEL ")"
#define OCTET "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
#define IPV4 OCTET "\\." OCTET "\\." OCTET "\\." OCTET
#define H16 "[0-9a-fA-F]{1,4}"
// RFC 3986's IPv6address: eight groups, "::" standing for one or more zero groups anywhere, the
// last 32 bits optionally as an IPv4 address (what Python's ipaddress accepts, zones aside).
#define LS32 "(" H16 ":" H16 "|" IPV4 ")"
#define IPV6                                                                                       \
  "((" H16 ":){6}" LS32 "|::(" H16 ":){5}" LS32 "|(" H16 ")?::(" H16 ":){4}" LS32 "|((" H16 ":)?" H16 \
  ")?::(" H16 ":){3}" LS32 "|((" H16 ":){0,2}" H16 ")?::(" H16 ":){2}" LS32 "|((" H16 ":){0,3}" H16   \
  ")?::" H16 ":" LS32 "|((" H16 ":){0,4}" H16 ")?::" LS32 "|((" H16 ":){0,5}" H16 ")?::" H16 "|((" H16 \
  ":){0,6}" H16 ")?::)"
// RFC 3986's URI: scheme ":" hier-part ["?" query] ["#" fragment], any scheme.
#define PCT "%[0-9A-Fa-f][0-9A-Fa-f]"
#define PCHAR "([A-Za-z0-9._~!$&'()*+,;=:@-]|" PCT ")"
#define URI_HOST "(\\[(" IPV6 "|v[0-9A-Fa-f]+\\.[A-Za-z0-9._~!$&'()*+,;=:-]+)\\]|([A-Za-z0-9._~!$&'()*+,;=-]|" PCT ")*)"
#define URI_AUTHORITY "(([A-Za-z0-9._~!$&'()*+,;=:-]|" PCT ")*@)?" URI_HOST "(:[0-9]*)?"
#define URI_HIER "(//" URI_AUTHORITY "(/" PCHAR "*)*|/(" PCHAR "+(/" PCHAR "*)*)?|" PCHAR "+(/" PCHAR "*)*)?"
#define URI "[A-Za-z][A-Za-z0-9+.-]*:" URI_HIER "(\\?(" PCHAR "|[/?])*)?(#(" PCHAR "|[/?])*)?"
// RFC 3339 appendix A durations, numbers of up to 4 digits: P then a date part (days, months and
// days, or years, months and days) with an optional time part, or a time part, or weeks.
#define DUR_N "[0-9]{1,4}"
#define DUR_TIME "T(" DUR_N "H(" DUR_N "M(" DUR_N "S)?)?|" DUR_N "M(" DUR_N "S)?|" DUR_N "S)"
#define DURATION                                                                                  \
  "P((" DUR_N "D|" DUR_N "M(" DUR_N "D)?|" DUR_N "Y(" DUR_N "M(" DUR_N "D)?)?)(" DUR_TIME ")?|" DUR_TIME \
  "|" DUR_N "W)"

const std::map<std::string, Format>& formats() {
  static const std::map<std::string, Format> kFormats = {
      {"date", {DATE, 10, 10}},
      {"time", {TIME, 9, 21}},
      {"date-time", {DATE "[Tt]" TIME, 20, 32}},
      {"duration", {DURATION, 3, 32}},
      {"email", {"([a-zA-Z0-9_+~-]{1,20}(\\.[a-zA-Z0-9_+~-]{1,20}){0,2}|\"[ !#-\\[\\]-~]{1,40}\")@(" HOST "|\\[" IPV4
                 "\\]|\\[IPv6:" IPV6 "\\])",
                 3, -1}},
      {"hostname", {HOST, 1, -1}},
      {"ipv4", {IPV4, 7, 15}},
      {"ipv6", {IPV6, 2, 45}},
      {"uri", {URI, 2, -1}},
      {"uri-reference", {"https?://" HOST "(/[a-zA-Z0-9._~-]{0,20}){0,6}", 8, -1}},
      {"uuid", {"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}", 36, 36}},
  };
  return kFormats;
}

int count(const Json& s, const char* key, const std::string& path, int dflt) {
  if (!s.contains(key)) return dflt;
  const Json& v = s[key];
  if (!v.is_number() || v.get<double>() < 0) refuse(key, path, "must be a non-negative integer");
  return static_cast<int>(std::min<double>(v.get<double>(), 100000));
}

}  // namespace

// ECMA-262 `pattern` is a search: an unanchored side may have any text around the match.
std::string search_regex(const std::string& pattern, bool anchored_whole) {
  std::string core = pattern;
  bool start = anchored_whole, end = anchored_whole;
  if (!core.empty() && core[0] == '^') start = true, core.erase(0, 1);
  if (!core.empty() && core.back() == '$') {
    size_t slashes = 0;
    for (size_t i = core.size() - 1; i-- > 0 && core[i] == '\\';) ++slashes;
    if (slashes % 2 == 0) end = true, core.pop_back();
  }
  return std::string(start ? "" : "[\\s\\S]*") + "(?:" + core + ")" + (end ? "" : "[\\s\\S]*");
}

// The JSON string content (escapes written as a string's grammar writes them) of the regex.
Expr SchemaCompiler::pattern_body(const std::string& pattern, const std::string& path, bool anchored_whole) {
  try {
    return regex_to_expr(search_regex(pattern, anchored_whole), RegexOptions{true});
  } catch (const Error& e) {
    refuse("pattern", path, e.what());
  }
}

Expr SchemaCompiler::pattern_string(const std::string& pattern, const std::string& path, bool anchored_whole) {
  return Expr::seq({Expr::literal("\""), as_rule("pattern", pattern_body(pattern, path, anchored_whole)), Expr::literal("\"")});
}

// A string in every one of `langs` (string contents): their automata's product. Too large for
// it: refused (best effort: the first language alone).
Expr SchemaCompiler::string_in_all(const std::vector<Expr>& langs, const char* keyword, const std::string& path,
                                   const std::string& what) {
  RuleSink rules{[&] { return new_rule("both"); }, [&](uint32_t r, Expr e) { define(r, std::move(e)); }};
  Intersection x = intersect(langs, rules);
  if (x.empty) no_instance(keyword, path, "no string has " + what);
  if (x.too_large) {
    unsupported(keyword, path, what + " (their intersection is too large)");
    return Expr::seq({Expr::literal("\""), as_rule("pattern", langs[0]), Expr::literal("\"")});
  }
  return Expr::seq({Expr::literal("\""), std::move(x.expr), Expr::literal("\"")});
}

Expr SchemaCompiler::compile_string(const Json& s, const std::string& path) {
  int min = count(s, "minLength", path, 0), max = count(s, "maxLength", path, -1);
  if (max >= 0 && max < min) no_instance("maxLength", path, "below minLength (no instance is valid)");
  // minLength / maxLength as a language of string contents (code points, escapes counted once).
  auto lengths = [&] { return Expr::repeat(Expr::alt(char_alternatives()), min, max); };
  if (s.contains("format") && s["format"].is_string()) {
    auto it = formats().find(s["format"].get<std::string>());
    if (it == formats().end()) {
      if (report_) report_->ignored.push_back(path + ": format " + s["format"].get<std::string>());
    } else {
      const Format& f = it->second;
      std::vector<Expr> langs{pattern_body(f.regex, path, true)};
      if (s.contains("pattern")) {
        if (!s["pattern"].is_string()) refuse("pattern", path, "must be a string");
        langs.push_back(pattern_body(s["pattern"].get<std::string>(), path, false));
      }
      if (min > f.min_len || (max >= 0 && (f.max_len < 0 || max < f.max_len))) langs.push_back(lengths());
      if (langs.size() == 1) return pattern_string(f.regex, path, true);
      return string_in_all(langs, "format", path, "the format and the pattern or lengths");
    }
  }
  if (s.contains("pattern")) {
    if (!s["pattern"].is_string()) refuse("pattern", path, "must be a string");
    if (min == 0 && max < 0) return pattern_string(s["pattern"].get<std::string>(), path, false);
    return string_in_all({pattern_body(s["pattern"].get<std::string>(), path, false), lengths()}, "pattern", path,
                         "the pattern and minLength/maxLength");
  }
  if (min == 0 && max < 0) return Expr::ref(common("string"));
  return Expr::seq({Expr::literal("\""), Expr::repeat(Expr::alt(char_alternatives()), min, max), Expr::literal("\"")});
}

}  // namespace fathom::grammar::schema
