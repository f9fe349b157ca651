// Values by bytes: arguments and results travel through cereal's binary archive.
//
// Supported: arithmetic types, std::string, the standard containers, std::tuple/pair,
// std::optional/variant, std::chrono durations, and any user type with cereal's usual
// customisation point (a `serialize(Archive&)` member or free function). Caller and rank
// are the same binary, so the native binary archive is exact.
#pragma once

#include <cereal/archives/binary.hpp>
#include <cereal/types/array.hpp>
#include <cereal/types/chrono.hpp>
#include <cereal/types/complex.hpp>
#include <cereal/types/deque.hpp>
#include <cereal/types/list.hpp>
#include <cereal/types/map.hpp>
#include <cereal/types/memory.hpp>
#include <cereal/types/optional.hpp>
#include <cereal/types/set.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/tuple.hpp>
#include <cereal/types/unordered_map.hpp>
#include <cereal/types/unordered_set.hpp>
#include <cereal/types/utility.hpp>
#include <cereal/types/variant.hpp>
#include <cereal/types/vector.hpp>
#include <sstream>
#include <string>
#include <string_view>

namespace sgpu::serialize {

template <class T>
std::string to_bytes(const T& value) {
  std::ostringstream out(std::ios::binary);
  {
    cereal::BinaryOutputArchive archive(out);
    archive(value);
  }
  return std::move(out).str();
}

// Throws cereal::Exception when the bytes do not hold a T.
template <class T>
T from_bytes(std::string_view bytes) {
  std::istringstream in(std::string(bytes), std::ios::binary);
  cereal::BinaryInputArchive archive(in);
  T value{};
  archive(value);
  return value;
}

}  // namespace sgpu::serialize
