// Numbers: minimum/maximum/exclusive* (integers exactly; numbers with a point exactly, with at
// most 6 integer and 9 fraction digits) and multipleOf for integers.
#include <cmath>
#include <map>
#include <optional>

#include "core/error.h"
#include "grammar/schema_compiler.h"

namespace fathom::grammar::schema {

namespace {

constexpr int64_t kClamp = 999'999'999'999'999'999;  // bounds beyond 18 digits are clamped inward
constexpr int64_t kFracMax = 999'999;                 // fractions only under 10^6: 15 significant
constexpr int kFracDigits = 9;                        // digits, so a double never rounds to a bound

Expr digit_set(char lo, char hi) { return SchemaCompiler::digits(lo, hi); }

// Decimal strings of equal length in [a, b] (no sign, leading digit as given).
Expr fixed_range(const std::string& a, const std::string& b) {
  if (a.empty()) return Expr::empty();
  if (a == b) return Expr::literal(a);
  if (a[0] == b[0]) return Expr::seq({Expr::literal(a.substr(0, 1)), fixed_range(a.substr(1), b.substr(1))});
  size_t n = a.size() - 1;
  std::vector<Expr> alts;
  alts.push_back(Expr::seq({Expr::literal(a.substr(0, 1)), fixed_range(a.substr(1), std::string(n, '9'))}));
  if (b[0] - a[0] > 1)
    alts.push_back(Expr::seq({digit_set(static_cast<char>(a[0] - '0' + 1), static_cast<char>(b[0] - '0' - 1)),
                              Expr::repeat(digit_set(0, 9), static_cast<int>(n), static_cast<int>(n))}));
  alts.push_back(Expr::seq({Expr::literal(b.substr(0, 1)), fixed_range(std::string(n, '0'), b.substr(1))}));
  return Expr::alt(std::move(alts));
}

// Canonical decimals (no leading zeros) in [lo, hi]; no hi: unbounded.
Expr uint_range(int64_t lo, std::optional<int64_t> hi) {
  std::string ls = std::to_string(lo);
  std::vector<Expr> alts;
  size_t max_len = hi ? std::to_string(*hi).size() : ls.size();
  for (size_t len = ls.size(); len <= max_len; ++len) {
    std::string a = len == ls.size() ? ls : "1" + std::string(len - 1, '0');
    std::string b = hi && len == max_len ? std::to_string(*hi) : std::string(len, '9');
    if (len == 1 && a == "0" && b != "0") {
      alts.push_back(fixed_range(a, b));
      continue;
    }
    if (a.size() == b.size() && a <= b) alts.push_back(fixed_range(a, b));
  }
  if (!hi)  // longer than lo: any canonical number
    alts.push_back(Expr::seq({digit_set(1, 9), Expr::repeat(digit_set(0, 9), static_cast<int>(ls.size()), -1)}));
  return Expr::alt(std::move(alts));
}

// Integers in [lo, hi] (each side optional).
Expr int_range(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  std::vector<Expr> alts;
  if (!lo || *lo < 0) {  // negatives: "-" then |x| in [max(1, -hi), -lo]
    int64_t mag_lo = hi && *hi < 0 ? -*hi : 1;
    std::optional<int64_t> mag_hi = lo ? std::optional<int64_t>(-*lo) : std::nullopt;
    alts.push_back(Expr::seq({Expr::literal("-"), uint_range(mag_lo, mag_hi)}));
  }
  if (!hi || *hi >= 0) alts.push_back(uint_range(lo && *lo > 0 ? *lo : 0, hi));
  return Expr::alt(std::move(alts));
}

// Decimal numbers divisible by k (a divisibility automaton over the digits); sign as asked.
Expr multiples(SchemaCompiler& c, int64_t k, bool neg, bool pos) {
  std::vector<uint32_t> ids;  // rule r: the digits read so far are = r (mod k)
  for (int64_t r = 0; r < k; ++r) ids.push_back(c.new_rule("mod"));
  auto step = [&](int64_t r, int d0) {
    std::map<int64_t, ByteSet> by_target;
    for (int d = d0; d < 10; ++d) by_target[(10 * r + d) % k].set(static_cast<uint8_t>('0' + d));
    std::vector<Expr> alts;
    for (auto& [t, set] : by_target) alts.push_back(Expr::seq({Expr::byte_set(set), Expr::ref(ids[t])}));
    return alts;
  };
  for (int64_t r = 0; r < k; ++r) {
    std::vector<Expr> alts = step(r, 0);
    if (r == 0) alts.push_back(Expr::empty());
    c.define(ids[r], Expr::alt(std::move(alts)));
  }
  Expr nonzero = c.as_rule("mult", Expr::alt(step(0, 1)));
  std::vector<Expr> alts = {Expr::literal("0")};
  if (pos) alts.push_back(nonzero);
  if (neg) alts.push_back(Expr::seq({Expr::literal("-"), nonzero}));
  return Expr::alt(std::move(alts));
}

struct Bounds {
  std::optional<long double> lo, hi;
  std::string lo_text, hi_text;  // as written in the schema (the decimal digits)
  bool lo_excl = false, hi_excl = false;
};

Bounds bounds_of(const Json& s, const std::string& path) {
  Bounds b;
  auto num = [&](const char* k) -> std::optional<long double> {
    if (!s.contains(k)) return std::nullopt;
    if (!s[k].is_number()) refuse(k, path, "must be a number");
    return s[k].get<long double>();
  };
  auto mn = num("minimum"), xmn = num("exclusiveMinimum"), mx = num("maximum"), xmx = num("exclusiveMaximum");
  auto text = [&](const char* k) { return s.contains(k) ? s[k].dump() : std::string(); };
  b.lo = mn, b.lo_text = text("minimum");
  if (xmn && (!b.lo || *xmn >= *b.lo)) b.lo = xmn, b.lo_excl = true, b.lo_text = text("exclusiveMinimum");
  b.hi = mx, b.hi_text = text("maximum");
  if (xmx && (!b.hi || *xmx <= *b.hi)) b.hi = xmx, b.hi_excl = true, b.hi_text = text("exclusiveMaximum");
  return b;
}

// A bound on the digits after the point: none, or 0.F >= / > / <= / < 0.D (D: the bound's
// fraction digits).
enum class Side { None, Incl, Excl };
struct FracBound {
  std::string digits;
  Side side = Side::None;
};

bool all_zero(const std::string& d) { return d.find_first_not_of('0') == std::string::npos; }

// Fraction digits F (at most n more) with lo <= 0.F <= hi (each side as given); `empty`: F may
// end here. Built digit by digit: each next digit either leaves a bound behind or keeps to it.
std::optional<Expr> fraction_digits(const FracBound& lo, const FracBound& hi, int n, bool empty) {
  std::vector<Expr> alts;
  // F ends here: the digits so far equal each bound's so far; the rest of 0.F is zero.
  bool lo_ok = lo.side == Side::None || (all_zero(lo.digits) && lo.side == Side::Incl);
  bool hi_ok = hi.side == Side::None || !all_zero(hi.digits) || hi.side == Side::Incl;
  if (empty && lo_ok && hi_ok) alts.push_back(Expr::empty());
  if (n > 0) {
    // Each digit's state per bound: left behind (0) or still equal (1); digits past it dropped.
    std::map<std::pair<int, int>, ByteSet> groups;
    for (int c = 0; c < 10; ++c) {
      auto state = [&](const FracBound& b, bool lower) {
        if (b.side == Side::None) return 0;
        int d = b.digits.empty() ? 0 : b.digits[0] - '0';
        if (c == d) return 1;
        return (c > d) == lower ? 0 : -1;
      };
      int l = state(lo, true), h = state(hi, false);
      if (l >= 0 && h >= 0) groups[{l, h}].set(static_cast<uint8_t>('0' + c));
    }
    auto rest = [](const FracBound& b, int equal) {
      return equal ? FracBound{b.digits.empty() ? b.digits : b.digits.substr(1), b.side} : FracBound{};
    };
    for (auto& [st, set] : groups) {
      std::optional<Expr> tail = st == std::make_pair(0, 0)
                                     ? std::optional<Expr>(Expr::repeat(digit_set(0, 9), 0, n - 1))
                                     : fraction_digits(rest(lo, st.first), rest(hi, st.second), n - 1, true);
      if (tail) alts.push_back(Expr::seq({Expr::byte_set(set), std::move(*tail)}));
    }
  }
  if (alts.empty()) return std::nullopt;
  return alts.size() == 1 ? std::move(alts[0]) : Expr::alt(std::move(alts));
}

// The magnitude of a JSON number's text as a decimal: integer part (kFracMax + 1 if larger)
// and fraction digits (exponent applied, trailing zeros dropped).
struct Decimal {
  int64_t whole = 0;
  std::string frac;
};
Decimal decimal_of(const std::string& text) {
  std::string digits;
  long point = -1, exp = 0;
  size_t i = text[0] == '-' ? 1 : 0;
  for (; i < text.size() && text[i] != 'e' && text[i] != 'E'; ++i)
    if (text[i] == '.') point = static_cast<long>(digits.size());
    else digits.push_back(text[i]);
  if (i < text.size()) exp = std::stol(text.substr(i + 1));
  if (point < 0) point = static_cast<long>(digits.size());
  point += exp;
  if (point < 0) digits.insert(0, static_cast<size_t>(-point), '0'), point = 0;
  if (point > static_cast<long>(digits.size())) digits.append(static_cast<size_t>(point) - digits.size(), '0');
  Decimal d;
  std::string whole = digits.substr(0, static_cast<size_t>(point));
  whole.erase(0, std::min(whole.find_first_not_of('0'), whole.size()));
  d.whole = whole.size() > 7 ? kFracMax + 1 : whole.empty() ? 0 : std::min<int64_t>(std::stoll(whole), kFracMax + 1);
  d.frac = digits.substr(static_cast<size_t>(point));
  while (!d.frac.empty() && d.frac.back() == '0') d.frac.pop_back();
  return d;
}

// Non-negative numbers written with a point, I.F (I at most kFracMax, F 1 to kFracDigits digits
// so that a double never rounds across a bound), within [lo, hi] (each optional: a magnitude
// and whether it is inclusive).
std::vector<Expr> fractions_between(std::optional<Decimal> lo, Side lo_side, std::optional<Decimal> hi, Side hi_side) {
  std::vector<Expr> alts;
  if (!lo) lo = Decimal{}, lo_side = Side::Incl;
  const int64_t first = lo->whole, top = hi ? std::min(hi->whole, kFracMax) : kFracMax;
  if (first > top) return alts;
  const FracBound none{}, lower{lo->frac, lo_side};
  const FracBound upper = hi && hi->whole <= kFracMax ? FracBound{hi->frac, hi_side} : none;
  auto point = [&](Expr whole, const FracBound& l, const FracBound& h) {
    if (auto f = fraction_digits(l, h, kFracDigits, false))
      alts.push_back(Expr::seq({std::move(whole), Expr::literal("."), std::move(*f)}));
  };
  point(Expr::literal(std::to_string(first)), lower, first == top ? upper : none);
  if (first + 1 <= top - 1) point(uint_range(first + 1, top - 1), none, none);
  if (top > first) point(Expr::literal(std::to_string(top)), none, upper);
  return alts;
}

}  // namespace

Expr SchemaCompiler::compile_number(const Json& s, bool integer, const std::string& path) {
  Bounds b = bounds_of(s, path);
  std::optional<int64_t> k;
  if (s.contains("multipleOf")) {
    const Json& m = s["multipleOf"];
    if (!m.is_number() || m.get<double>() <= 0) refuse("multipleOf", path, "must be a positive number");
    double v = m.get<double>();
    if (v != std::floor(v) || v > 1e6) {
      unsupported("multipleOf", path, "only integer multipleOf (at most 10^6) is enforced");
    } else {
      k = static_cast<int64_t>(v);
      integer = true;  // integer multiples are the subset generated
    }
  }
  if (!integer && !b.lo && !b.hi) return Expr::ref(common("number"));
  auto clamp = [](long double v) { return static_cast<int64_t>(std::max<long double>(-kClamp, std::min<long double>(kClamp, v))); };
  std::optional<int64_t> ilo, ihi;
  if (b.lo) ilo = clamp(b.lo_excl ? std::floor(*b.lo) + 1 : std::ceil(*b.lo));
  if (b.hi) ihi = clamp(b.hi_excl ? std::ceil(*b.hi) - 1 : std::floor(*b.hi));
  bool any_int = !(ilo && ihi && *ilo > *ihi);
  std::vector<Expr> alts;
  if (k && *k > 1) {
    if (ilo && ihi) {
      int64_t first = static_cast<int64_t>(std::ceil(static_cast<long double>(*ilo) / *k)) * *k;
      for (int64_t v = first, n = 0; v <= *ihi && n < 256; v += *k, ++n) alts.push_back(Expr::literal(std::to_string(v)));
    } else if ((!ilo || *ilo <= 0) && (!ihi || *ihi >= 0)) {
      alts.push_back(multiples(*this, *k, !ilo, !ihi));
    } else {  // one side open, zero outside: the 256 multiples nearest the bound (a subset)
      int64_t step = ilo ? *k : -*k;
      int64_t first = ilo ? static_cast<int64_t>(std::ceil(static_cast<long double>(*ilo) / *k)) * *k
                          : static_cast<int64_t>(std::floor(static_cast<long double>(*ihi) / *k)) * *k;
      for (int64_t v = first, n = 0; n < 256 && std::abs(v) <= kClamp; v += step, ++n) alts.push_back(Expr::literal(std::to_string(v)));
    }
  } else if (any_int) {
    alts.push_back(int_range(ilo, ihi));
  }
  if (!integer) {
    // Numbers with a point: x >= 0 as written, and x <= 0 as "-" and -x in [-hi, -lo].
    Side lo_side = b.lo_excl ? Side::Excl : Side::Incl, hi_side = b.hi_excl ? Side::Excl : Side::Incl;
    auto mag = [](const std::string& text) { return std::optional<Decimal>(decimal_of(text)); };
    if (!b.hi || *b.hi >= 0)
      for (Expr& e : fractions_between(b.lo && *b.lo >= 0 ? mag(b.lo_text) : std::nullopt, lo_side,
                                       b.hi ? mag(b.hi_text) : std::nullopt, hi_side))
        alts.push_back(std::move(e));
    if (!b.lo || *b.lo < 0)
      for (Expr& e : fractions_between(b.hi && *b.hi <= 0 ? mag(b.hi_text) : std::nullopt, hi_side,
                                       b.lo ? mag(b.lo_text) : std::nullopt, lo_side))
        alts.push_back(Expr::seq({Expr::literal("-"), std::move(e)}));
  }
  if (alts.empty()) no_instance(b.lo ? "minimum" : "maximum", path, "no number satisfies the bounds");
  return as_rule("num", Expr::alt(std::move(alts)));
}

}  // namespace fathom::grammar::schema
