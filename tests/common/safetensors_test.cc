#include "common/safetensors.h"

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common/file_util.h"
#include "common/safetensors_concat.h"
#include "common/safetensors_file.h"
#include "gtest/gtest.h"

namespace shardline::common {
namespace {

SafetensorsContents Sample() {
  SafetensorsContents c;
  const std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -1.0f};
  c.tensors.emplace("b.weight", *Tensor::FromValues<float>({2, 3}, a));
  const std::vector<int32_t> ids = {4, 5, 6};
  c.tensors.emplace("a.ids", *Tensor::FromValues<int32_t>({3}, ids));
  c.tensors.emplace("c.half", *(*Tensor::FromValues<float>({2}, std::vector<float>{0.5f, 2.0f}))
                                   .ConvertTo(DType::kBF16));
  c.metadata = {{"spec", "{\"name\": \"x\"}\n\t"}, {"format", "pt"}};
  return c;
}

TEST(SafetensorsTest, RoundTripsTensorsAndMetadata) {
  auto bytes = SerializeSafetensors(Sample());
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ((bytes->size() - 8 - 24 - 12 - 4) % 8, 0u) << "header padded to 8 bytes";
  auto back = ParseSafetensors(*bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->metadata, Sample().metadata);
  ASSERT_EQ(back->tensors.size(), 3u);
  const Tensor& w = back->tensors.at("b.weight");
  EXPECT_EQ(w.shape(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(w.values<float>()[2], 3.25f);
  EXPECT_EQ(back->tensors.at("a.ids").values<int32_t>()[1], 5);
  EXPECT_EQ(back->tensors.at("c.half").dtype(), DType::kBF16);
}

// The bytes of a small file, written out by hand from the safetensors format:
// an 8-byte little-endian header length, the JSON header (metadata first,
// then the tensors in name order, data_offsets relative to the data) padded
// with spaces to a multiple of 8, then each tensor's little-endian bytes.
TEST(SafetensorsTest, WritesTheFormatsByteLayout) {
  SafetensorsContents c;
  c.tensors.emplace("b", *(*Tensor::FromValues<float>({1, 2}, std::vector<float>{0.5f, -1.0f}))
                              .ConvertTo(DType::kBF16));
  c.tensors.emplace("a", *Tensor::FromValues<int32_t>({1}, std::vector<int32_t>{7}));
  c.metadata = {{"format", "pt"}};
  const std::string header =
      R"({"__metadata__":{"format":"pt"},)"
      R"("a":{"dtype":"I32","shape":[1],"data_offsets":[0,4]},)"
      R"("b":{"dtype":"BF16","shape":[1,2],"data_offsets":[4,8]}})";
  ASSERT_EQ(header.size(), 141u);
  const std::string want = std::string("\x90\0\0\0\0\0\0\0", 8)  // 144 = 141 + 3 spaces
                           + header + "   "
                           + std::string("\x07\0\0\0", 4)            // a: int32 7
                           + std::string("\x00\x3f\x80\xbf", 4);     // b: bf16 0.5 (0x3f00), -1 (0xbf80)
  auto bytes = SerializeSafetensors(c);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, want);
}

TEST(SafetensorsTest, CorruptFilesAreRejected) {
  const std::string good = *SerializeSafetensors(Sample());
  EXPECT_FALSE(ParseSafetensors(good.substr(0, 5)).ok());
  EXPECT_FALSE(ParseSafetensors(good.substr(0, good.size() - 1)).ok()) << "truncated data";
  EXPECT_FALSE(ParseSafetensors(good + "x").ok()) << "trailing bytes";
  std::string huge_header = good;
  huge_header[5] = 0x7f;
  EXPECT_FALSE(ParseSafetensors(huge_header).ok());
  std::string bad_dtype = good;
  bad_dtype.replace(bad_dtype.find("\"F32\""), 5, "\"F64\"");
  EXPECT_FALSE(ParseSafetensors(bad_dtype).ok());
  std::string bad_json = good;
  bad_json[8] = '[';
  EXPECT_FALSE(ParseSafetensors(bad_json).ok());
  // Found by fuzz_safetensors: a tensor named "" was read, and could not be
  // written again (a name must be a name).
  std::string empty_name = good;
  empty_name.replace(empty_name.find("\"a.ids\""), 7, "\"\"     ");
  auto refused = ParseSafetensors(empty_name);
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("empty name"), std::string::npos) << refused.status();
}

TEST(SafetensorsTest, WritesAtomicallyAndReadsBack) {
  const std::string path = ::testing::TempDir() + "/weights.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, Sample()).ok());
  auto back = ReadSafetensors(path);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->tensors.size(), 3u);
  EXPECT_EQ(ReadSafetensors(path + ".missing").status().code(), absl::StatusCode::kNotFound);
}

// A file opened for single tensors: the header is checked against the
// file's size, and each tensor read alone equals the whole file's parse.
TEST(SafetensorsTest, AFileReadsOneTensorAtATime) {
  const std::string path = ::testing::TempDir() + "/single.safetensors";
  const std::string bytes = *SerializeSafetensors(Sample());
  ASSERT_TRUE(WriteFileAtomically(path, bytes).ok());
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->size(), bytes.size());
  EXPECT_EQ((*file)->index().metadata, Sample().metadata);
  ASSERT_EQ((*file)->index().entries.size(), 3u);
  auto w = (*file)->Read("b.weight");
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->shape(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(w->values<float>()[2], 3.25f);
  EXPECT_EQ((*file)->Read("a.ids")->values<int32_t>()[2], 6);
  EXPECT_EQ((*file)->Read("nope").status().code(), absl::StatusCode::kNotFound);

  ASSERT_TRUE(WriteFileAtomically(path, bytes.substr(0, bytes.size() - 4)).ok());
  EXPECT_EQ(SafetensorsFile::Open(path).status().code(), absl::StatusCode::kInvalidArgument) << "truncated";
  ASSERT_TRUE(WriteFileAtomically(path, bytes.substr(0, 5)).ok());
  EXPECT_EQ(SafetensorsFile::Open(path).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SafetensorsFile::Open(path + ".missing").status().code(), absl::StatusCode::kNotFound);
}

// Tensors of two files as one (those the filter keeps): the bytes
// SerializeSafetensors gives for them, read in any pieces, also once the
// files are deleted; a name in both files is refused.
TEST(SafetensorsTest, FilesConcatenateIntoOneReadPieceByPiece) {
  SafetensorsContents first = Sample(), second;
  second.tensors.emplace("d.weight", *Tensor::FromValues<float>({2}, std::vector<float>{9.0f, -9.0f}));
  second.tensors.emplace("skip.me", *Tensor::FromValues<float>({1}, std::vector<float>{1.0f}));
  second.tensors.emplace("a.empty", *Tensor::Zeros(DType::kF32, {0, 3}));
  const std::string dir = ::testing::TempDir();
  auto open = [&](const std::string& name, const SafetensorsContents& c) {
    EXPECT_TRUE(WriteSafetensors(dir + "/" + name, c).ok());
    return std::move(*SafetensorsFile::Open(dir + "/" + name));
  };
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  files.push_back(open("first.safetensors", first));
  files.push_back(open("second.safetensors", second));
  const std::map<std::string, std::string> metadata = {{"step", "4"}};
  auto concat = SafetensorsConcat::Create(
      std::move(files), [](const std::string& name) { return name != "skip.me"; }, metadata);
  ASSERT_TRUE(concat.ok()) << concat.status();
  std::remove((dir + "/first.safetensors").c_str());  // open files stay readable
  std::remove((dir + "/second.safetensors").c_str());

  SafetensorsContents want;
  for (const SafetensorsContents* c : {&first, &second}) {
    for (const auto& [name, tensor] : c->tensors) {
      if (name != "skip.me") want.tensors.emplace(name, tensor);
    }
  }
  want.metadata = metadata;
  const std::string bytes = *SerializeSafetensors(want);
  EXPECT_EQ((*concat)->size(), bytes.size());
  EXPECT_EQ(*(*concat)->ReadAll(), bytes);
  for (size_t piece : {1, 7, 64, 1000}) {
    std::string read;
    for (uint64_t at = 0; at < (*concat)->size();) {
      auto chunk = (*concat)->Read(at, piece);
      ASSERT_TRUE(chunk.ok()) << chunk.status();
      ASSERT_FALSE(chunk->empty());
      read += *chunk;
      at += chunk->size();
    }
    EXPECT_EQ(read, bytes) << "pieces of " << piece;
  }
  EXPECT_EQ(*(*concat)->Read((*concat)->size(), 10), "");

  std::vector<std::unique_ptr<SafetensorsFile>> twice;
  twice.push_back(open("again1.safetensors", first));
  twice.push_back(open("again2.safetensors", first));
  EXPECT_EQ(SafetensorsConcat::Create(std::move(twice), [](const std::string&) { return true; }, {}).status().code(),
            absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace shardline::common
