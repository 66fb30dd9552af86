// Writes a safetensors file whose values follow a formula, for
// check_safetensors.py to compare against the Python safetensors package:
//   value[i] = ((i · 37) mod 101 − 50) / 8   (exact in f32, bf16 and f16)
// Usage: safetensors_fixture OUT_FILE
#include <cstdio>
#include <vector>

#include "common/safetensors.h"

using shardline::common::DType;
using shardline::common::SafetensorsContents;
using shardline::common::Tensor;

namespace {

float Formula(int64_t i) { return static_cast<float>((i * 37) % 101 - 50) / 8.0f; }

Tensor Make(std::vector<int64_t> shape, DType dtype) {
  Tensor f32 = *Tensor::Zeros(DType::kF32, shape);
  auto values = f32.values<float>();
  for (size_t i = 0; i < values.size(); ++i) values[i] = Formula(static_cast<int64_t>(i));
  if (dtype == DType::kI32) {
    Tensor out = *Tensor::Zeros(DType::kI32, shape);
    for (size_t i = 0; i < values.size(); ++i) out.values<int32_t>()[i] = static_cast<int32_t>(values[i] * 8);
    return out;
  }
  return *f32.ConvertTo(dtype);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_FILE\n", argv[0]);
    return 3;
  }
  SafetensorsContents contents;
  contents.tensors.emplace("blocks.0.attn.qkv.weight", Make({6, 4}, DType::kF32));
  contents.tensors.emplace("blocks.0.ln1.bias", Make({4}, DType::kF32));
  contents.tensors.emplace("half.f16", Make({3, 2, 2}, DType::kF16));
  contents.tensors.emplace("half.bf16", Make({5}, DType::kBF16));
  contents.tensors.emplace("ids.i32", Make({7}, DType::kI32));
  contents.tensors.emplace("scalar", Make({}, DType::kF32));
  contents.metadata = {{"format", "pt"}, {"note", "quote \" backslash \\ newline \n done"}};
  const absl::Status status = shardline::common::WriteSafetensors(argv[1], contents);
  if (!status.ok()) {
    std::fprintf(stderr, "Error: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}
