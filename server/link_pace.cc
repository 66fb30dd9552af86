#include "server/link_pace.h"

#include <cmath>

namespace shardline::server {

void LinkPace::Note(int64_t bytes, double seconds) {
  if (bytes <= 0 || !(seconds >= kMinSeconds) || !std::isfinite(seconds)) return;
  rates_.Add(static_cast<double>(bytes) / seconds);
}

}  // namespace shardline::server
