#include "server/step_pace.h"

namespace shardline::server {

void StepPace::Reset() { *this = StepPace(); }

void StepPace::Note(double seconds) {
  if (noted_++ == 0 || seconds <= 0) return;  // the epoch's first step warms up
  seconds_.Add(seconds);
}

}  // namespace shardline::server
