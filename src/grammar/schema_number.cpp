// Numbers: minimum/maximum/exclusive* (integers exactly; numbers as integers in range plus
// fractions strictly between two integers in range) and multipleOf for integers.
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
  b.lo = mn;
  if (xmn && (!b.lo || *xmn >= *b.lo)) b.lo = xmn, b.lo_excl = true;
  b.hi = mx;
  if (xmx && (!b.hi || *xmx <= *b.hi)) b.hi = xmx, b.hi_excl = true;
  return b;
}

// Fractions ".d*[1-9]" after an integer part in [lo, hi] (the value strictly between two
// integers both within the bounds).
Expr fraction_part() {
  return Expr::seq({Expr::literal("."), Expr::repeat(digit_set(0, 9), 0, kFracDigits - 1), digit_set(1, 9)});
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
    // positive fractions I.F in (I, I+1): I >= lo and I + 1 <= hi
    int64_t plo = std::max<int64_t>(0, b.lo ? clamp(std::ceil(*b.lo)) : 0);
    int64_t phi = std::min<int64_t>(kFracMax, b.hi ? clamp(std::floor(*b.hi)) - 1 : kFracMax);
    if (plo <= phi) alts.push_back(Expr::seq({uint_range(plo, phi), fraction_part()}));
    // negative fractions -(I.F) in (-(I+1), -I): -(I+1) >= lo and -I <= hi
    int64_t nlo = std::max<int64_t>(0, b.hi ? clamp(std::ceil(-*b.hi)) : 0);
    int64_t nhi = std::min<int64_t>(kFracMax, b.lo ? clamp(std::floor(-*b.lo)) - 1 : kFracMax);
    if (nlo <= nhi) alts.push_back(Expr::seq({Expr::literal("-"), uint_range(nlo, nhi), fraction_part()}));
  }
  if (alts.empty()) refuse(b.lo ? "minimum" : "maximum", path, "no number satisfies the bounds");
  return as_rule("num", Expr::alt(std::move(alts)));
}

}  // namespace fathom::grammar::schema
