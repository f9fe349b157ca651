#include "sgpu/internal/values.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace sgpu::serialize {
namespace {

struct Point {
  double x = 0;
  double y = 0;
  std::string label;
  bool operator==(const Point&) const = default;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(x, y, label);
  }
};

template <class T>
void check_round_trip(const T& value) {
  RC_ASSERT(from_bytes<T>(to_bytes(value)) == value);
}

RC_GTEST_PROP(Values, IntegersRoundTrip, (std::int64_t a, std::uint8_t b, int c)) {
  check_round_trip(std::make_tuple(a, b, c));
}
RC_GTEST_PROP(Values, StringsAndVectorsRoundTrip,
              (const std::string& s, const std::vector<std::string>& v,
               const std::vector<std::int32_t>& ints)) {
  check_round_trip(std::make_tuple(s, v, ints));
}
RC_GTEST_PROP(Values, MapsAndOptionalsRoundTrip,
              (const std::map<std::string, std::int64_t>& m, bool has, const std::string& s)) {
  check_round_trip(m);
  check_round_trip(has ? std::optional<std::string>(s) : std::nullopt);
}
RC_GTEST_PROP(Values, UserTypesRoundTrip, (std::int32_t x, std::int32_t y, const std::string& l)) {
  // Finite doubles built from integers, so that == is exact.
  check_round_trip(std::vector<Point>{Point{x / 4.0, y * 0.5, l}, Point{}});
}

TEST(Values, FloatsRoundTripBitExactly) {
  const std::vector<double> values = {0.0, -0.0, 1e-308, 3.141592653589793,
                                      std::numeric_limits<double>::infinity()};
  EXPECT_EQ(from_bytes<std::vector<double>>(to_bytes(values)), values);
}

TEST(Values, ShortInputThrows) {
  const std::string bytes = to_bytes(std::string("hello world"));
  EXPECT_ANY_THROW(from_bytes<std::string>(bytes.substr(0, 4)));
}

}  // namespace
}  // namespace sgpu::serialize
