// Control-flow helpers for absl::Status, which Abseil 20220623 does not ship.
//
//   RETURN_IF_ERROR(DoThing());            // returns the status if not OK
//   ASSIGN_OR_RETURN(Tensor t, MakeIt());  // declares t, or returns the error
//   ASSIGN_OR_RETURN(existing, MakeIt());  // assigns to an existing variable
#ifndef SHARDLINE_COMMON_STATUS_MACROS_H_
#define SHARDLINE_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/base/optimization.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define SHARDLINE_STATUS_CONCAT_INNER_(a, b) a##b
#define SHARDLINE_STATUS_CONCAT_(a, b) SHARDLINE_STATUS_CONCAT_INNER_(a, b)

#define RETURN_IF_ERROR(expr)                                          \
  do {                                                                 \
    ::absl::Status shardline_status_ = (expr);                         \
    if (ABSL_PREDICT_FALSE(!shardline_status_.ok())) {                 \
      return shardline_status_;                                        \
    }                                                                  \
  } while (false)

#define SHARDLINE_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                     \
  if (ABSL_PREDICT_FALSE(!statusor.ok())) {                    \
    return std::move(statusor).status();                       \
  }                                                            \
  lhs = std::move(statusor).value()

#define ASSIGN_OR_RETURN(lhs, rexpr)                                        \
  SHARDLINE_ASSIGN_OR_RETURN_IMPL_(                                         \
      SHARDLINE_STATUS_CONCAT_(shardline_statusor_, __LINE__), lhs, rexpr)

#endif  // SHARDLINE_COMMON_STATUS_MACROS_H_
