#include "worker/nn/optimizer.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace shardline::worker::nn {

OptimizerConfig OptimizerConfig::FromSpec(const shardline::v1::TrainSpec& train) {
  const auto& o = train.optimizer();
  OptimizerConfig c;
  c.adamw = o.kind() == "adamw";
  c.lr = o.lr();
  c.weight_decay = o.weight_decay();
  c.warmup_steps = o.warmup_steps();
  c.total_steps = train.steps();
  c.min_lr_ratio = o.min_lr_ratio();
  c.beta1 = o.beta1();
  c.beta2 = o.beta2();
  c.eps = o.eps();
  c.momentum = o.momentum();
  c.grad_clip = o.grad_clip();
  return c;
}

double LearningRate(const OptimizerConfig& c, int64_t step) {
  if (c.warmup_steps > 0 && step <= c.warmup_steps) {
    return c.lr * static_cast<double>(step) / static_cast<double>(c.warmup_steps);
  }
  const double span = static_cast<double>(std::max<int64_t>(c.total_steps - c.warmup_steps, 1));
  const double progress = std::clamp(static_cast<double>(step - c.warmup_steps) / span, 0.0, 1.0);
  const double min_lr = c.lr * c.min_lr_ratio;
  return min_lr + 0.5 * (c.lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

double ClipFactor(const OptimizerConfig& c, double grad_norm) {
  if (c.grad_clip <= 0.0 || !(grad_norm > c.grad_clip)) return 1.0;
  return c.grad_clip / grad_norm;
}

absl::Status Optimizer::Step(const std::vector<Parameter*>& params, int64_t step, double grad_factor) {
  std::vector<Share> whole;
  for (const Parameter* p : params) whole.push_back({{0, p->count()}});
  return StepShares(params, whole, step, grad_factor);
}

absl::Status Optimizer::StepShares(const std::vector<Parameter*>& params, const std::vector<Share>& shares,
                                   int64_t step, double grad_factor) {
  if (shares.size() != params.size()) {
    return absl::InvalidArgumentError(absl::StrCat(shares.size(), " shares for ", params.size(), " parameters"));
  }
  const float lr = static_cast<float>(LearningRate(config_, step));
  for (size_t i = 0; i < params.size(); ++i) {
    Parameter* p = params[i];
    size_t n = 0, end = 0;
    for (const Range& r : shares[i]) {
      if (r.begin < end || r.begin > r.end || r.end > p->count()) {
        return absl::InvalidArgumentError(absl::StrCat("elements [", r.begin, ", ", r.end, ") of ", p->name, " (",
                                                       p->count(), ") out of order or out of range"));
      }
      n += r.end - r.begin;
      end = r.end;
    }
    if (n == 0) continue;
    if (p->state1.bytes() == 0) {
      ASSIGN_OR_RETURN(p->state1, backend_.AllocateZeros(n));
      if (config_.adamw) {
        ASSIGN_OR_RETURN(p->state2, backend_.AllocateZeros(n));
      }
    }
    if (p->state1.bytes() != n * sizeof(float)) {
      return absl::FailedPreconditionError(absl::StrCat("the optimizer state of ", p->name, " covers other elements"));
    }
    const float decay = p->decay ? static_cast<float>(config_.weight_decay) : 0.0f;
    size_t at = 0;  // in the state
    for (const Range& r : shares[i]) {
      const size_t count = r.end - r.begin;
      if (count == 0) continue;
      const DeviceSpan<float> value = p->v().subspan(r.begin, count);
      const DeviceSpan<float> grad = p->g().subspan(r.begin, count);
      const DeviceSpan<float> m = p->state1.span<float>().subspan(at, count);
      at += count;
      if (grad_factor != 1.0) RETURN_IF_ERROR(backend_.Scale(grad, static_cast<float>(grad_factor)));
      if (config_.adamw) {
        const AdamWStep s{lr, static_cast<float>(config_.beta1), static_cast<float>(config_.beta2),
                          static_cast<float>(config_.eps), decay, step};
        const DeviceSpan<float> v = p->state2.span<float>().subspan(at - count, count);
        RETURN_IF_ERROR(backend_.AdamWUpdate(s, value, grad, m, v));
      } else {
        const SgdStep s{lr, static_cast<float>(config_.momentum), decay};
        RETURN_IF_ERROR(backend_.SgdMomentumUpdate(s, value, grad, m));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace shardline::worker::nn
