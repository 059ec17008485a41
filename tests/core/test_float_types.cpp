// Tests for braid::half, braid::bfloat16 (core/float16.hpp) and braid::fp8_e4m3, braid::fp8_e5m2
// (core/fp8.hpp).
//
// The reference here shares nothing with the headers but the formats' parameters: it decodes an
// encoding with std::ldexp, and encodes a double by finding its neighbours among all finite values of
// the format (a sorted table) and comparing with their midpoint, ties going to the even encoding.
#include <braid/core/float16.hpp>
#include <braid/core/fp8.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

namespace {

// ---------------------------------------------------------------- compile-time properties

template <class T>
constexpr bool is_plain_value_type = std::is_trivially_copyable_v<T> && std::is_standard_layout_v<T> &&
                                     std::is_trivially_default_constructible_v<T>;

static_assert(is_plain_value_type<braid::half> && sizeof(braid::half) == 2);
static_assert(is_plain_value_type<braid::bfloat16> && sizeof(braid::bfloat16) == 2);
static_assert(is_plain_value_type<braid::fp8_e4m3> && sizeof(braid::fp8_e4m3) == 1);
static_assert(is_plain_value_type<braid::fp8_e5m2> && sizeof(braid::fp8_e5m2) == 1);
static_assert(std::is_same_v<decltype(braid::half::bits), std::uint16_t>);
static_assert(std::is_same_v<decltype(braid::bfloat16::bits), std::uint16_t>);
static_assert(std::is_same_v<decltype(braid::fp8_e4m3::bits), std::uint8_t>);
static_assert(std::is_same_v<decltype(braid::fp8_e5m2::bits), std::uint8_t>);
static_assert(!std::is_convertible_v<float, braid::half>); // the float constructor is explicit
static_assert(std::is_convertible_v<braid::half, float>);   // the float conversion is not

static_assert(float(braid::half(1.5f)) == 1.5f);
static_assert(braid::half(1.5f).bits == 0x3e00);
static_assert(braid::half(1.0).bits == 0x3c00);
static_assert(float(braid::bfloat16(1.5f)) == 1.5f);
static_assert(braid::bfloat16(-2.0f).bits == 0xc000);
static_assert(float(braid::fp8_e4m3(1.5f)) == 1.5f);
static_assert(braid::fp8_e4m3(448.0f).bits == 0x7e);
static_assert(float(braid::fp8_e5m2(1.5f)) == 1.5f);
static_assert(braid::fp8_e5m2(57344.0).bits == 0x7b);
static_assert(float(braid::half::from_bits(0x0001)) == 0x1p-24f);
static_assert(float(braid::half(2.0f) * braid::half(3.0f)) == 6.0f);
static_assert(braid::half(1.0f) < braid::half(2.0f));
static_assert(float(std::numeric_limits<braid::half>::max()) == 65504.0f);
static_assert(float(std::numeric_limits<braid::fp8_e4m3>::max()) == 448.0f);
static_assert(float(std::numeric_limits<braid::fp8_e5m2>::max()) == 57344.0f);

// ---------------------------------------------------------------- the formats, as the tests see them

// ieee: an all-ones exponent is infinity or NaN (else only S.1111.111 is special: NaN). saturating:
// overflow gives the largest finite value (else infinity). inf: +infinity's encoding, where there is
// one; nan: the NaN a conversion produces (the fp8 formats; 0 where the tests do not use it).
struct format {
  const char* name;
  int exp_bits, man_bits;
  bool ieee, saturating;
  std::uint32_t max_finite, inf = 0, nan = 0;
};
template <class T>
constexpr format spec{};
template <>
constexpr format spec<braid::half>{.name = "half", .exp_bits = 5, .man_bits = 10, .ieee = true, .saturating = false,
                                   .max_finite = 0x7bff, .inf = 0x7c00};
template <>
constexpr format spec<braid::bfloat16>{.name = "bfloat16", .exp_bits = 8, .man_bits = 7, .ieee = true, .saturating = false,
                                       .max_finite = 0x7f7f, .inf = 0x7f80};
template <>
constexpr format spec<braid::fp8_e4m3>{.name = "fp8_e4m3", .exp_bits = 4, .man_bits = 3, .ieee = false, .saturating = true,
                                       .max_finite = 0x7e, .nan = 0x7f};
template <>
constexpr format spec<braid::fp8_e5m2>{.name = "fp8_e5m2", .exp_bits = 5, .man_bits = 2, .ieee = true, .saturating = true,
                                       .max_finite = 0x7b, .inf = 0x7c, .nan = 0x7e};

template <class T>
constexpr int total_bits = 1 + spec<T>.exp_bits + spec<T>.man_bits;
template <class T>
constexpr std::uint32_t sign_bit = 1u << (total_bits<T> - 1);
template <class T>
constexpr int bias = (1 << (spec<T>.exp_bits - 1)) - 1;

template <class T>
T make(std::uint32_t bits) {
  return T::from_bits(static_cast<decltype(T::bits)>(bits));
}

template <class T>
bool ref_is_nan(std::uint32_t bits) {
  constexpr format S = spec<T>;
  const std::uint32_t mag = bits & (sign_bit<T> - 1);
  if constexpr (S.ieee) {
    return (mag >> S.man_bits) == (1u << S.exp_bits) - 1 && (mag & ((1u << S.man_bits) - 1)) != 0;
  } else {
    return mag == sign_bit<T> - 1;
  }
}

// The value of an encoding, computed with std::ldexp.
template <class T>
double ref_decode(std::uint32_t bits) {
  constexpr format S = spec<T>;
  const bool neg = (bits & sign_bit<T>) != 0;
  const std::uint32_t mag = bits & (sign_bit<T> - 1);
  const int ef = int(mag >> S.man_bits);
  const int m = int(mag & ((1u << S.man_bits) - 1));
  double v = 0;
  if (ref_is_nan<T>(bits)) {
    v = std::numeric_limits<double>::quiet_NaN();
  } else if (S.ieee && ef == (1 << S.exp_bits) - 1) {
    v = std::numeric_limits<double>::infinity();
  } else if (ef == 0) {
    v = std::ldexp(double(m), 1 - bias<T> - S.man_bits);
  } else {
    v = std::ldexp(double((1 << S.man_bits) + m), ef - bias<T> - S.man_bits);
  }
  return neg ? -v : v;
}

// All finite magnitudes in increasing order: table[i] is the value of encoding i, i <= max_finite. For a
// format that overflows to infinity, one more entry: 2^(emax + 1), where an unbounded exponent would put
// the next value (the encoding after max_finite, which is the infinity).
template <class T>
const std::vector<double>& magnitudes() {
  static const std::vector<double> table = [] {
    std::vector<double> t;
    for (std::uint32_t b = 0; b <= spec<T>.max_finite; ++b) t.push_back(ref_decode<T>(b));
    if (!spec<T>.saturating) {
      t.push_back(std::ldexp(1.0, int(spec<T>.max_finite >> spec<T>.man_bits) - bias<T> + 1));
    }
    return t;
  }();
  return table;
}

// The encoding braid must produce for x; for NaN, any NaN of the right sign is accepted (checked apart).
template <class T>
std::uint32_t ref_encode(double x) {
  constexpr format S = spec<T>;
  const std::uint32_t sign = std::signbit(x) ? sign_bit<T> : 0u;
  const double a = std::fabs(x);
  const auto& t = magnitudes<T>();
  if constexpr (S.saturating) {
    if (std::isinf(a) || a >= t.back()) return sign | S.max_finite;
  } else {
    static_assert(S.inf == S.max_finite + 1);
    if (std::isinf(a) || a >= t.back()) return sign | S.inf;
  }
  // t[hi - 1] <= a < t[hi]
  const auto hi = std::size_t(std::upper_bound(t.begin(), t.end(), a) - t.begin());
  const std::size_t lo = hi - 1;
  const double mid = (t[lo] + t[hi]) / 2; // exact: both have few significant bits
  std::size_t pick = 0;
  if (a < mid) {
    pick = lo;
  } else if (a > mid) {
    pick = hi;
  } else {
    pick = (lo % 2 == 0) ? lo : hi; // tie: the even encoding
  }
  return sign | std::uint32_t(pick);
}

// ---------------------------------------------------------------- mismatch bookkeeping

struct tally {
  std::size_t checked = 0;
  std::size_t failed = 0;
  std::vector<std::string> examples;

  void fail(const std::string& what) {
    ++failed;
    if (examples.size() < 8) examples.push_back(what);
  }
  void report(const char* name) const {
    const std::string n(name);
    for (const auto& e : examples) MESSAGE(n << ": " << e);
    INFO(n << ": " << failed << " of " << checked << " failed");
    CHECK(checked > 0);
    CHECK(failed == 0);
  }
};

template <class Src>
std::string describe(Src x, std::uint32_t got, std::uint32_t want) {
  std::ostringstream os;
  os.precision(std::numeric_limits<Src>::max_digits10);
  os << std::hexfloat << double(x) << std::defaultfloat << " (" << double(x) << "): got 0x" << std::hex
     << got << ", want 0x" << want;
  return os.str();
}

template <class T>
constexpr bool is_fp8 = std::is_same_v<T, braid::fp8_e4m3> || std::is_same_v<T, braid::fp8_e5m2>;

// Converts x (float or double) with braid and compares with the reference.
template <class T, class Src>
void check_encode(tally& tl, Src x) {
  ++tl.checked;
  const std::uint32_t got = T(x).bits;
  if (std::isnan(x)) {
    const bool sign_ok = ((got & sign_bit<T>) != 0) == std::signbit(x);
    bool form_ok = ref_is_nan<T>(got);
    if constexpr (is_fp8<T>) {
      form_ok = (got & (sign_bit<T> - 1)) == spec<T>.nan; // the one NaN a conversion produces
    } else {
      form_ok = form_ok && ((got >> (spec<T>.man_bits - 1)) & 1u) != 0; // quiet
    }
    if (!sign_ok || !form_ok) tl.fail(describe(x, got, 0));
    return;
  }
  const std::uint32_t want = ref_encode<T>(double(x));
  if (got != want) tl.fail(describe(x, got, want));
}

template <class T>
std::vector<float> float_samples() {
  std::vector<float> s;
  // Every 4093rd float bit pattern: all exponents (NaN, inf, subnormals included), varied low bits.
  for (std::uint64_t u = 0; u <= 0xffffffffu; u += 4093) s.push_back(std::bit_cast<float>(std::uint32_t(u)));
  // Random bit patterns.
  std::mt19937 rng(20240611u);
  for (int i = 0; i < 500000; ++i) s.push_back(std::bit_cast<float>(std::uint32_t(rng())));
  // A grid of 2^(man_bits + 6) points per binade over the format's exponent range and a little beyond.
  const int emin = 1 - bias<T> - spec<T>.man_bits - 2;
  const int emax = int(spec<T>.max_finite >> spec<T>.man_bits) - bias<T> + 3;
  const int steps = 1 << (spec<T>.man_bits + 6);
  for (int e = emin; e <= emax; ++e) {
    for (int j = 0; j < steps; ++j) {
      const auto f = float(std::ldexp(1.0 + double(j) / steps, e));
      s.push_back(f);
      s.push_back(-f);
    }
  }
  // Uniform random floats across the finite range and a bit past it.
  const double top = 2 * ref_decode<T>(spec<T>.max_finite);
  std::uniform_real_distribution<double> uni(-top, top);
  for (int i = 0; i < 200000; ++i) s.push_back(float(uni(rng)));
  // Midpoints of adjacent values (and of max and the overflow threshold) and one float ulp either side;
  // the values themselves.
  const auto& t = magnitudes<T>();
  std::size_t inexact_midpoints = 0;
  for (std::size_t i = 0; i + 1 < t.size() + (spec<T>.saturating ? 1 : 0); ++i) {
    const double next = i + 1 < t.size() ? t[i + 1] : 2 * t[i] - t[i - 1]; // saturating: max + ulp
    const auto mid = float((t[i] + next) / 2);
    if (double(mid) != (t[i] + next) / 2) ++inexact_midpoints;
    for (float f : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, HUGE_VALF), float(t[i])}) {
      s.push_back(f);
      s.push_back(-f);
    }
  }
  CHECK(inexact_midpoints == 0); // every midpoint is a float, so these test ties exactly
  // Specials.
  constexpr float inf = std::numeric_limits<float>::infinity();
  for (float f : {0.0f, inf, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::signaling_NaN(),
                  std::bit_cast<float>(0x7f800001u), std::bit_cast<float>(0x7fffffffu),
                  std::numeric_limits<float>::max(), std::numeric_limits<float>::min(),
                  std::numeric_limits<float>::denorm_min(), 1.0f, 0.5f}) {
    s.push_back(f);
    s.push_back(-f);
  }
  return s;
}

} // namespace

#define BRAID_FLOAT_TYPES braid::half, braid::bfloat16, braid::fp8_e4m3, braid::fp8_e5m2

TEST_CASE_TEMPLATE("float types: every encoding decodes exactly and re-encodes to itself", T, BRAID_FLOAT_TYPES) {
  tally decode_tl;
  tally round_trip;
  for (std::uint32_t b = 0; b < (1u << total_bits<T>); ++b) {
    const float f = make<T>(b);
    const double want = ref_decode<T>(b);
    ++decode_tl.checked;
    ++round_trip.checked;
    if (ref_is_nan<T>(b)) {
      if (!std::isnan(f) || std::signbit(f) != ((b & sign_bit<T>) != 0)) decode_tl.fail(describe(f, b, 0));
      const std::uint32_t back = T(f).bits;
      if (!ref_is_nan<T>(back) || (back & sign_bit<T>) != (b & sign_bit<T>)) round_trip.fail(describe(f, back, b));
      continue;
    }
    if (double(f) != want || std::signbit(f) != std::signbit(want)) {
      decode_tl.fail(describe(f, b, std::bit_cast<std::uint32_t>(float(want))));
    }
    // A saturating conversion takes an infinity to the largest finite value of the same sign.
    const std::uint32_t expect = (spec<T>.saturating && std::isinf(want))
                                     ? (b & sign_bit<T>) | spec<T>.max_finite
                                     : b;
    const std::uint32_t back = T(f).bits;
    if (back != expect) round_trip.fail(describe(f, back, expect));
    ++round_trip.checked; // and through double
    if (T(double(f)).bits != expect) round_trip.fail(describe(double(f), T(double(f)).bits, expect));
  }
  decode_tl.report(spec<T>.name);
  round_trip.report(spec<T>.name);
}

TEST_CASE_TEMPLATE("float types: float -> T matches the reference (round to nearest even)", T, BRAID_FLOAT_TYPES) {
  tally tl;
  for (float f : float_samples<T>()) check_encode<T>(tl, f);
  tl.report(spec<T>.name);
}

TEST_CASE_TEMPLATE("float types: double -> T rounds once, not via float", T, BRAID_FLOAT_TYPES) {
  tally tl;
  const auto& t = magnitudes<T>();
  for (std::size_t i = 0; i + 1 < t.size(); ++i) {
    const double mid = (t[i] + t[i + 1]) / 2;
    // mid * (1 +- 2^-40) rounds to mid as a float, so a conversion through float would see a tie.
    for (double d : {mid, mid * (1 + 0x1p-40), mid * (1 - 0x1p-40), std::nextafter(mid, 0.0), std::nextafter(mid, HUGE_VAL)}) {
      check_encode<T>(tl, d);
      check_encode<T>(tl, -d);
    }
  }
  std::mt19937_64 rng(7);
  for (int i = 0; i < 200000; ++i) check_encode<T>(tl, std::bit_cast<double>(std::uint64_t(rng())));
  std::uniform_real_distribution<double> uni(-2 * t.back(), 2 * t.back());
  for (int i = 0; i < 200000; ++i) check_encode<T>(tl, uni(rng));
  for (double d : {0.0, -0.0, HUGE_VAL, -HUGE_VAL, std::numeric_limits<double>::quiet_NaN(),
                   -std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::denorm_min(),
                   std::numeric_limits<double>::max(), -std::numeric_limits<double>::max()}) {
    check_encode<T>(tl, d);
  }
  tl.report(spec<T>.name);
}

TEST_CASE("half and bfloat16: overflow to infinity, signed zero, NaN") {
  constexpr float inf = std::numeric_limits<float>::infinity();
  constexpr float nan = std::numeric_limits<float>::quiet_NaN();
  CHECK(braid::half(65504.0f).bits == 0x7bff);
  CHECK(braid::half(65519.996f).bits == 0x7bff);
  CHECK(braid::half(65520.0f).bits == 0x7c00); // tie with max (odd) goes to infinity
  CHECK(braid::half(-65520.0f).bits == 0xfc00);
  CHECK(braid::half(1e9f).bits == 0x7c00);
  CHECK(braid::half(inf).bits == 0x7c00);
  CHECK(braid::half(-inf).bits == 0xfc00);
  CHECK(braid::half(-0.0f).bits == 0x8000);
  CHECK(braid::half(0.0f).bits == 0x0000);
  CHECK(braid::half(-1e-10f).bits == 0x8000);  // underflow keeps the sign
  CHECK(braid::half(0x1p-25f).bits == 0x0000); // tie between 0 and 2^-24: even (0)
  CHECK(braid::half(std::nextafter(0x1p-25f, 1.0f)).bits == 0x0001);
  CHECK(braid::half(0x1.8p-24f).bits == 0x0002); // tie between 1 and 2 subnormal units: even (2)
  CHECK(braid::half(std::numeric_limits<float>::max()).bits == 0x7c00);
  CHECK(std::isinf(float(braid::half(inf))));
  CHECK((braid::half(nan).bits & 0x7fff) > 0x7c00);
  CHECK((braid::half(-nan).bits & 0x8000) != 0);

  CHECK(braid::bfloat16(std::numeric_limits<float>::max()).bits == 0x7f80);
  CHECK(braid::bfloat16(-std::numeric_limits<float>::max()).bits == 0xff80);
  CHECK(braid::bfloat16(0x1.fep127f).bits == 0x7f7f);
  CHECK(braid::bfloat16(0x1.ffp127f).bits == 0x7f80); // tie with max (odd) goes to infinity
  CHECK(braid::bfloat16(inf).bits == 0x7f80);
  CHECK(braid::bfloat16(-0.0f).bits == 0x8000);
  CHECK(braid::bfloat16(std::numeric_limits<float>::denorm_min()).bits == 0x0000);
  CHECK(braid::bfloat16(0x1p-133f).bits == 0x0001); // smallest bfloat16 subnormal
  CHECK(braid::bfloat16(-0x1p-134f).bits == 0x8000);
  CHECK(braid::bfloat16(0x1.8p-134f).bits == 0x0001);
  CHECK(braid::bfloat16(1.00390625f).bits == 0x3f80); // 1 + 2^-8: tie, even
  CHECK(braid::bfloat16(1.01171875f).bits == 0x3f82); // 1 + 3 * 2^-8: tie, even
  CHECK((braid::bfloat16(nan).bits & 0x7fff) > 0x7f80);
  CHECK((braid::bfloat16(-nan).bits & 0x8000) != 0);
  CHECK((braid::bfloat16(std::bit_cast<float>(0x7f800001u)).bits & 0x7fff) > 0x7f80); // NaN stays NaN
}

TEST_CASE("fp8: saturation, signed zero, NaN") {
  constexpr float inf = std::numeric_limits<float>::infinity();
  constexpr float nan = std::numeric_limits<float>::quiet_NaN();
  using e4 = braid::fp8_e4m3;
  using e5 = braid::fp8_e5m2;
  // {value, its encoding}
  const std::pair<float, unsigned> e4_encodings[] = {
      {448.0f, 0x7e},
      {464.0f, 0x7e}, // tie: even, and saturation
      {480.0f, 0x7e},
      {1e9f, 0x7e},
      {-1e9f, 0xfe},
      {inf, 0x7e},
      {-inf, 0xfe},
      {nan, 0x7f},
      {-nan, 0xff},
      {-0.0f, 0x80},
      {0x1p-9f, 0x01},  // smallest subnormal
      {0x1p-10f, 0x00}, // tie with 0: even
      {-0x1p-11f, 0x80},
      {0x1.8p-9f, 0x02}, // tie between 1 and 2 units: even
  };
  for (const auto& [x, bits] : e4_encodings) CHECK_MESSAGE(e4(x).bits == bits, "e4m3(" << x << ")");
  CHECK(float(e4::from_bits(0x7e)) == 448.0f);
  CHECK(float(e4::from_bits(0x78)) == 256.0f); // S.1111.000 is a number, not infinity
  CHECK(std::isnan(float(e4::from_bits(0x7f))));
  CHECK(std::isnan(float(e4::from_bits(0xff))));

  const std::pair<float, unsigned> e5_encodings[] = {
      {57344.0f, 0x7b},
      {61440.0f, 0x7b}, // tie with max (odd): rounds up, saturates
      {1e9f, 0x7b},
      {-1e9f, 0xfb},
      {inf, 0x7b},
      {-inf, 0xfb},
      {nan, 0x7e},
      {-nan, 0xfe},
      {-0.0f, 0x80},
      {0x1p-16f, 0x01},
      {0x1p-17f, 0x00},
  };
  for (const auto& [x, bits] : e5_encodings) CHECK_MESSAGE(e5(x).bits == bits, "e5m2(" << x << ")");
  CHECK(std::isinf(float(e5::from_bits(0x7c))));
  CHECK(std::isnan(float(e5::from_bits(0x7d))));

  // Arithmetic rounds back with the same saturation.
  CHECK((e4(448.0f) + e4(448.0f)).bits == 0x7e);
  CHECK((e5(-57344.0f) * e5(2.0f)).bits == 0xfb);
}

TEST_CASE_TEMPLATE("float types: arithmetic and comparisons go through float", T, BRAID_FLOAT_TYPES) {
  const T one(1.0f), two(2.0f), three(3.0f), nan = std::numeric_limits<T>::quiet_NaN();
  CHECK(one + two == three);
  CHECK(three - two == one);
  CHECK(two * one == two);
  CHECK(three / three == one);
  CHECK(float(-two) == -2.0f);
  CHECK((-two).bits == (two.bits ^ T::sign_mask));
  CHECK(float(+two) == 2.0f);
  T x = one;
  x += two;
  CHECK(x == three);
  x -= one;
  CHECK(x == two);
  x *= three;
  CHECK(float(x) == 6.0f);
  x /= two;
  CHECK(x == three);
  CHECK(one < two);
  CHECK(one <= one);
  CHECK(two > one);
  CHECK(two >= two);
  CHECK(one != two);
  CHECK_FALSE(nan == nan);
  CHECK(nan != nan);
  CHECK_FALSE(nan < one);
  CHECK_FALSE(nan >= one);
  CHECK(T(0.0f) == T(-0.0f));
  CHECK(T(0.0f).bits != T(-0.0f).bits);
  // Mixed with float: the built-in float operators, through the implicit conversion.
  CHECK(one + 0.5f == 1.5f);
  CHECK(two == 2.0f);
  // The result rounds like a conversion of the float result: 1 + epsilon/2 is a tie, goes to 1.
  const T eps = std::numeric_limits<T>::epsilon();
  CHECK(one + T(float(eps) / 2) == one);
  CHECK(float(one + eps) == 1.0f + float(eps));
}

TEST_CASE_TEMPLATE("float types: numeric_limits agree with the encodings", T, BRAID_FLOAT_TYPES) {
  using L = std::numeric_limits<T>;
  static_assert(L::is_specialized && L::is_signed && !L::is_integer && !L::is_exact && L::radix == 2);
  CHECK(L::digits == spec<T>.man_bits + 1);
  CHECK(L::has_infinity == (spec<T>.ieee));
  CHECK(L::has_quiet_NaN);
  CHECK(float(L::max()) == float(ref_decode<T>(spec<T>.max_finite)));
  CHECK(float(L::lowest()) == -float(L::max()));
  CHECK(float(L::min()) == std::ldexp(1.0f, L::min_exponent - 1));
  CHECK(float(L::denorm_min()) == std::ldexp(1.0f, L::min_exponent - L::digits));
  CHECK(float(L::max()) < std::ldexp(1.0f, L::max_exponent));
  CHECK(float(L::max()) >= std::ldexp(1.0f, L::max_exponent - 1));
  CHECK(float(L::epsilon()) == float(make<T>(T(1.0f).bits + 1u)) - 1.0f);
  CHECK(float(L::round_error()) == 0.5f);
  CHECK(std::isnan(float(L::quiet_NaN())));
  if constexpr (spec<T>.ieee) CHECK(L::infinity().bits == spec<T>.inf);
  if (L::has_infinity) {
    CHECK(std::isinf(float(L::infinity())));
    CHECK(float(L::infinity()) > 0);
  }
  if (L::has_signaling_NaN) CHECK(std::isnan(float(L::signaling_NaN())));
  // digits10 / max_digits10 / exponent10 by their definitions
  CHECK(L::digits10 == int(std::floor((L::digits - 1) * std::log10(2.0))));
  CHECK(L::max_digits10 == int(std::ceil(1 + L::digits * std::log10(2.0))));
  CHECK(L::min_exponent10 == int(std::ceil(std::log10(double(float(L::min()))))));
  CHECK(L::max_exponent10 == int(std::floor(std::log10(double(float(L::max()))))));
}

// The encodings of the limits, written out: numeric_limits derives them from the format.
template <class T>
void check_limit_bits(std::array<unsigned, 9> want) {
  using L = std::numeric_limits<T>;
  const std::array<unsigned, 9> got{L::min().bits,         L::max().bits,       L::lowest().bits,
                                    L::epsilon().bits,     L::round_error().bits, L::infinity().bits,
                                    L::quiet_NaN().bits,   L::signaling_NaN().bits, L::denorm_min().bits};
  CHECK(got == want);
}

TEST_CASE("float types: numeric_limits encodings and exponents") {
  check_limit_bits<braid::half>({0x0400, 0x7bff, 0xfbff, 0x1400, 0x3800, 0x7c00, 0x7e00, 0x7d00, 0x0001});
  check_limit_bits<braid::bfloat16>({0x0080, 0x7f7f, 0xff7f, 0x3c00, 0x3f00, 0x7f80, 0x7fc0, 0x7fa0, 0x0001});
  check_limit_bits<braid::fp8_e4m3>({0x08, 0x7e, 0xfe, 0x20, 0x30, 0x00, 0x7f, 0x00, 0x01});
  check_limit_bits<braid::fp8_e5m2>({0x04, 0x7b, 0xfb, 0x34, 0x38, 0x7c, 0x7e, 0x7d, 0x01});
  using H = std::numeric_limits<braid::half>;
  using B = std::numeric_limits<braid::bfloat16>;
  using E4 = std::numeric_limits<braid::fp8_e4m3>;
  using E5 = std::numeric_limits<braid::fp8_e5m2>;
  static_assert(H::digits10 == 3 && H::max_digits10 == 5 && H::min_exponent == -13 && H::max_exponent == 16);
  static_assert(B::digits10 == 2 && B::max_digits10 == 4 && B::min_exponent == -125 && B::max_exponent == 128);
  static_assert(E4::digits10 == 0 && E4::max_digits10 == 3 && E4::min_exponent == -5 && E4::max_exponent == 9);
  static_assert(E5::digits10 == 0 && E5::max_digits10 == 2 && E5::min_exponent == -13 && E5::max_exponent == 16);
  static_assert(H::min_exponent10 == -4 && B::min_exponent10 == -37 && E4::min_exponent10 == -1);
  static_assert(H::max_exponent10 == 4 && B::max_exponent10 == 38 && E4::max_exponent10 == 2);
  static_assert(E5::min_exponent10 == -4 && E5::max_exponent10 == 4);
  static_assert(!E4::has_infinity && !E4::has_signaling_NaN && E5::has_infinity && E5::has_signaling_NaN);
  static_assert(H::has_infinity && H::has_signaling_NaN && B::has_infinity && B::has_signaling_NaN);
}
