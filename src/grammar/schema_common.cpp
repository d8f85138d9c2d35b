// The shared JSON rules (any value, strings, numbers) and list helpers of the schema compiler.
#include "grammar/schema_compiler.h"

namespace fathom::grammar::schema {

uint32_t SchemaCompiler::common(const std::string& name) {
  if (b_.has_rule(name)) return b_.rule(name);
  uint32_t r = b_.rule(name);
  commons_.insert(r);
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

Expr SchemaCompiler::digits(char lo, char hi) {
  ByteSet s;
  s.set_range(static_cast<uint8_t>('0' + lo), static_cast<uint8_t>('0' + hi));
  return Expr::byte_set(s);
}

// One JSON string character: a safe code point or an escape.
std::vector<Expr> SchemaCompiler::char_alternatives() {
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
Expr SchemaCompiler::list(const char* open, Expr item, int min, int max, const char* close) {
  Expr more = Expr::seq({Expr::literal(","), sp(), item});
  int rest_min = std::max(min - 1, 0), rest_max = max < 0 ? -1 : max - 1;
  Expr body = Expr::seq({item, Expr::repeat(more, rest_min, rest_max)});
  if (min == 0) body = Expr::repeat(std::move(body), 0, 1);
  if (max == 0) body = Expr::empty();
  return Expr::seq({Expr::literal(open), std::move(body), Expr::literal(close)});
}

Expr SchemaCompiler::as_rule(const std::string& hint, Expr e) {
  uint32_t r = new_rule(hint);
  b_.define(r, std::move(e));
  return Expr::ref(r);
}

}  // namespace fathom::grammar::schema
