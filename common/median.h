// The median of a few figures (repeated probes, recent steps): the middle
// one, or the mean of the middle two; 0 for none.
#ifndef SHARDLINE_COMMON_MEDIAN_H_
#define SHARDLINE_COMMON_MEDIAN_H_

#include <algorithm>
#include <vector>

namespace shardline::common {

inline double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t half = values.size() / 2;
  return values.size() % 2 == 1 ? values[half] : (values[half - 1] + values[half]) / 2;
}

}  // namespace shardline::common

#endif  // SHARDLINE_COMMON_MEDIAN_H_
