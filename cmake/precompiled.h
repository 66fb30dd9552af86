// The third-party and generated headers most of our files parse,
// precompiled once per kind of target (cmake/ShardlineHelpers.cmake:
// shardline_precompiled_header) and reused by every library, binary and
// test of that kind. They change only when the packages or the .proto
// files do. Each file still includes what it uses; this saves parsing
// them again (about a third of a gRPC-heavy file's compile time).
#ifndef SHARDLINE_CMAKE_PRECOMPILED_H_
#define SHARDLINE_CMAKE_PRECOMPILED_H_

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "glog/logging.h"
#include "shardline/v1/admin.grpc.pb.h"
#include "shardline/v1/coordinator.grpc.pb.h"
#include "shardline/v1/job.pb.h"
#include "shardline/v1/stage_link.grpc.pb.h"
#include "shardline/v1/tensor.pb.h"

#endif  // SHARDLINE_CMAKE_PRECOMPILED_H_
