#include "common/model_layout.h"

#include <algorithm>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/dtype.h"
#include "common/input_limits.h"

namespace shardline::common {

namespace {

constexpr char kOptimizerPrefix[] = "optimizer.";
constexpr size_t kNamesShown = 3;

// "a, b, c and 7 more"
std::string SomeNames(const std::vector<std::string>& names) {
  std::vector<std::string> shown(names.begin(), names.begin() + std::min(names.size(), kNamesShown));
  std::string out = absl::StrJoin(shown, ", ");
  if (names.size() > shown.size()) absl::StrAppend(&out, " and ", names.size() - shown.size(), " more");
  return out;
}

}  // namespace

std::vector<ModelParameter> ModelParameters(const shardline::v1::ModelSpec& model) {
  const int64_t c = model.d_model(), v = model.vocab_size();
  std::vector<ModelParameter> out = {{"tok_emb.weight", {v, c}, 0}, {"pos_emb.weight", {model.context(), c}, 0}};
  for (int i = 0; i < model.n_layers(); ++i) {
    const std::string p = absl::StrCat("blocks.", i, ".");
    const int unit = i + 1;
    for (const auto& [name, shape] : std::vector<std::pair<const char*, std::vector<int64_t>>>{
             {"ln1.weight", {c}},
             {"ln1.bias", {c}},
             {"attn.qkv.weight", {3 * c, c}},
             {"attn.qkv.bias", {3 * c}},
             {"attn.proj.weight", {c, c}},
             {"attn.proj.bias", {c}},
             {"ln2.weight", {c}},
             {"ln2.bias", {c}},
             {"mlp.fc.weight", {4 * c, c}},
             {"mlp.fc.bias", {4 * c}},
             {"mlp.proj.weight", {c, 4 * c}},
             {"mlp.proj.bias", {c}},
         }) {
      out.push_back({p + name, shape, unit});
    }
  }
  const int head = model.n_layers() + 1;
  out.push_back({"ln_f.weight", {c}, head});
  out.push_back({"ln_f.bias", {c}, head});
  out.push_back({"lm_head.weight", {v, c}, head});
  return out;
}

absl::Status CheckWeightsFitModel(const SafetensorsIndex& index, const shardline::v1::ModelSpec& model,
                                  const std::string& what) {
  const std::vector<ModelParameter> parameters = ModelParameters(model);
  std::set<std::string> names;
  std::vector<std::string> missing, misshapen, extra;
  for (const ModelParameter& p : parameters) {
    names.insert(p.name);
    auto it = index.entries.find(p.name);
    if (it == index.entries.end()) {
      missing.push_back(p.name);
    } else if (it->second.dtype != DType::kF32 || it->second.shape != p.shape) {
      misshapen.push_back(absl::StrCat(p.name, " is ", DTypeName(it->second.dtype), ShapeString(it->second.shape),
                                       ", the model's f32", ShapeString(p.shape)));
    }
  }
  for (const auto& [name, entry] : index.entries) {
    if (!names.count(name) && !absl::StartsWith(name, kOptimizerPrefix)) extra.push_back(Quote(name));
  }
  if (missing.empty() && misshapen.empty() && extra.empty()) return absl::OkStatus();
  std::vector<std::string> problems;
  if (!misshapen.empty()) problems.push_back(SomeNames(misshapen));
  if (!missing.empty()) {
    problems.push_back(absl::StrCat("they lack ", missing.size(), " of its ", parameters.size(),
                                    " tensors (", SomeNames(missing), ")"));
  }
  if (!extra.empty()) {
    problems.push_back(absl::StrCat("they hold ", extra.size(), " tensors it does not have (", SomeNames(extra), ")"));
  }
  return absl::InvalidArgumentError(absl::StrCat(what, " do not fit the spec's model (", model.ShortDebugString(),
                                                 "): ", absl::StrJoin(problems, "; ")));
}

}  // namespace shardline::common
