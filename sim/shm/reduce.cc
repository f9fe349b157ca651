#include "sim/shm/reduce.h"

#include <ATen/Dispatch_v2.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <type_traits>

namespace sgpu::sim::shm {
namespace {

using Op = c10d::ReduceOp::RedOpType;

template <class T>
constexpr bool kComplex = c10::is_complex<T>::value;

template <class T>
bool is_nan(T v) {
  if constexpr (std::is_integral_v<T>) {
    return false;
  } else {
    return std::isnan(static_cast<double>(v));
  }
}

// Integer add and multiply in the unsigned type of the same width: two's-complement
// wrapping, as torch's, without signed overflow.
template <class T>
T add(T a, T b) {
  if constexpr (std::is_same_v<T, bool>) {
    return a || b;
  } else if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return a + b;
  }
}

template <class T>
T mul(T a, T b) {
  if constexpr (std::is_same_v<T, bool>) {
    return a && b;
  } else if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    // Promote to unsigned int first: uint8/uint16 would promote to (signed) int.
    using W = std::conditional_t<(sizeof(U) < sizeof(unsigned)), unsigned, U>;
    return static_cast<T>(
        static_cast<U>(static_cast<W>(static_cast<U>(a)) * static_cast<W>(static_cast<U>(b))));
  } else {
    return a * b;
  }
}

template <class T>
void fold(T* acc, const T* x, std::size_t n, Op op) {
  switch (op) {
    case Op::SUM:
    case Op::AVG:
      for (std::size_t i = 0; i < n; ++i) acc[i] = add(acc[i], x[i]);
      return;
    case Op::PRODUCT:
      for (std::size_t i = 0; i < n; ++i) acc[i] = mul(acc[i], x[i]);
      return;
    case Op::MIN:
      if constexpr (!kComplex<T>) {
        // torch.minimum: a NaN on either side wins.
        for (std::size_t i = 0; i < n; ++i) {
          if (!is_nan(acc[i]) && (is_nan(x[i]) || x[i] < acc[i])) acc[i] = x[i];
        }
        return;
      }
      break;
    case Op::MAX:
      if constexpr (!kComplex<T>) {
        for (std::size_t i = 0; i < n; ++i) {
          if (!is_nan(acc[i]) && (is_nan(x[i]) || x[i] > acc[i])) acc[i] = x[i];
        }
        return;
      }
      break;
    case Op::BAND:
      if constexpr (std::is_integral_v<T>) {
        for (std::size_t i = 0; i < n; ++i) acc[i] = static_cast<T>(acc[i] & x[i]);
        return;
      }
      break;
    case Op::BOR:
      if constexpr (std::is_integral_v<T>) {
        for (std::size_t i = 0; i < n; ++i) acc[i] = static_cast<T>(acc[i] | x[i]);
        return;
      }
      break;
    case Op::BXOR:
      if constexpr (std::is_integral_v<T>) {
        for (std::size_t i = 0; i < n; ++i) acc[i] = static_cast<T>(acc[i] ^ x[i]);
        return;
      }
      break;
    default:
      break;
  }
  TORCH_CHECK(false, "internal: combine() called with an unchecked op");
}

}  // namespace

const char* reduce_op_name(Op op) {
  switch (op) {
    case Op::SUM:
      return "SUM";
    case Op::AVG:
      return "AVG";
    case Op::PRODUCT:
      return "PRODUCT";
    case Op::MIN:
      return "MIN";
    case Op::MAX:
      return "MAX";
    case Op::BAND:
      return "BAND";
    case Op::BOR:
      return "BOR";
    case Op::BXOR:
      return "BXOR";
    case Op::PREMUL_SUM:
      return "PREMUL_SUM";
    default:
      return "UNUSED";
  }
}

void check_reducible(c10::ScalarType dtype, Op op) {
  const bool floating = c10::isFloatingType(dtype);
  const bool complex = c10::isComplexType(dtype);
  const bool integral = c10::isIntegralType(dtype, /*includeBool=*/true);
  TORCH_CHECK(floating || complex || integral, "sgpu's shared-memory transport cannot reduce ",
              dtype, " tensors");
  switch (op) {
    case Op::SUM:
    case Op::PRODUCT:
      return;
    case Op::AVG:
      TORCH_CHECK(dtype != c10::kBool, "ReduceOp.AVG needs a numeric dtype, not bool");
      return;
    case Op::MIN:
    case Op::MAX:
      TORCH_CHECK(!complex, "ReduceOp.", reduce_op_name(op), " is not defined for complex dtype ",
                  dtype);
      return;
    case Op::BAND:
    case Op::BOR:
    case Op::BXOR:
      TORCH_CHECK(integral, "ReduceOp.", reduce_op_name(op), " needs an integral dtype, not ",
                  dtype);
      return;
    default:
      TORCH_CHECK(false, "sgpu's shared-memory transport does not support ReduceOp.",
                  reduce_op_name(op));
  }
}

void combine(void* acc, const void* x, std::size_t count, c10::ScalarType dtype, Op op) {
  AT_DISPATCH_V2(dtype, "sgpu_shm_combine", AT_WRAP([&] {
                   fold(static_cast<scalar_t*>(acc), static_cast<const scalar_t*>(x), count, op);
                 }),
                 AT_EXPAND(AT_ALL_TYPES_AND_COMPLEX), c10::kHalf, c10::kBFloat16, c10::kBool);
}

}  // namespace sgpu::sim::shm
