// CheckedInt64: int64 arithmetic that remembers an overflow instead of
// wrapping (or, from a double, being undefined). For sizes computed from
// input (a job spec's memory, FLOPs and bytes): a result that overflowed is
// a spec too large to run, never a negative size that "fits".
#ifndef SHARDLINE_COMMON_CHECKED_INT_H_
#define SHARDLINE_COMMON_CHECKED_INT_H_

#include <cstdint>
#include <limits>

namespace shardline::common {

class CheckedInt64 {
 public:
  constexpr CheckedInt64() = default;
  constexpr CheckedInt64(int64_t value) : value_(value) {}  // NOLINT: implicit on purpose

  // False once any step of the computation overflowed.
  constexpr bool ok() const { return ok_; }
  // The value; int64's largest once it overflowed (so that a comparison
  // with a limit refuses it).
  constexpr int64_t value() const { return ok_ ? value_ : std::numeric_limits<int64_t>::max(); }

  friend constexpr CheckedInt64 operator+(CheckedInt64 a, CheckedInt64 b) {
    CheckedInt64 r;
    r.ok_ = a.ok_ && b.ok_ && !__builtin_add_overflow(a.value_, b.value_, &r.value_);
    return r;
  }
  friend constexpr CheckedInt64 operator-(CheckedInt64 a, CheckedInt64 b) {
    CheckedInt64 r;
    r.ok_ = a.ok_ && b.ok_ && !__builtin_sub_overflow(a.value_, b.value_, &r.value_);
    return r;
  }
  friend constexpr CheckedInt64 operator*(CheckedInt64 a, CheckedInt64 b) {
    CheckedInt64 r;
    r.ok_ = a.ok_ && b.ok_ && !__builtin_mul_overflow(a.value_, b.value_, &r.value_);
    return r;
  }
  // Rounded toward zero; `divisor` must be positive.
  constexpr CheckedInt64 DividedBy(int64_t divisor) const {
    CheckedInt64 r = *this;
    if (ok_) r.value_ = value_ / divisor;
    return r;
  }
  CheckedInt64& operator+=(CheckedInt64 b) { return *this = *this + b; }
  CheckedInt64& operator*=(CheckedInt64 b) { return *this = *this * b; }

 private:
  int64_t value_ = 0;
  bool ok_ = true;
};

}  // namespace shardline::common

#endif  // SHARDLINE_COMMON_CHECKED_INT_H_
