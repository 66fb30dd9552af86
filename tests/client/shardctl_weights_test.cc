// Jobs that start from given weights, through the real shardctl, coordinator
// and workers: another job's (init.from_job) or a file sent with the spec
// (submit --init_weights, Shardline's or converted from elsewhere), each bit
// for bit what shardline-train makes of the same start; starts that do not
// fit the spec's model are refused keeping nothing.
#include <algorithm>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "common/file_util.h"
#include "common/safetensors.h"
#include "gtest/gtest.h"
#include "shardline/v1/admin.pb.h"
#include "tests/client/process_cluster.h"
#include "tests/client/process_test_util.h"
#include "tests/client/shardctl_fixture.h"

namespace shardline::client {
namespace {

using namespace testing::shardctl;  // the fixture, spec and exit descriptions
using testing::CtlRun;
using testing::kBin;
using testing::RunToEnd;

// Every tensor of `want` is in `got` with the same values.
void ExpectSameWeights(const common::SafetensorsContents& got, const common::SafetensorsContents& want,
                       const std::string& what) {
  ASSERT_EQ(got.tensors.size(), want.tensors.size()) << what;
  for (const auto& [name, tensor] : want.tensors) {
    ASSERT_EQ(got.tensors.count(name), 1u) << what << ": " << name;
    const auto a = got.tensors.at(name).values<float>(), b = tensor.values<float>();
    ASSERT_TRUE(std::equal(a.begin(), a.end(), b.begin(), b.end())) << what << ": " << name;
  }
}

// A job that starts from another's committed weights (init.from_job), on
// another layout: exactly what shardline-train makes of its spec from the
// other's exported weights (--init_weights), which it needs for such a spec.
TEST_F(ShardctlTest, AJobStartsFromAnothersWeightsAsTheReferenceRunDoes) {
  const std::string dir = cluster().dir();
  auto run = [&](const std::string& spec) {  // submitted and watched to its end: its id
    const CtlRun submitted = cluster().Ctl({"-o", "json", "submit", spec});
    EXPECT_EQ(submitted.ended, kOk) << submitted.err;
    const std::string id = FromJson<shardline::v1::JobStatus>(submitted.out).job_id();
    const CtlRun watched = cluster().Ctl({"watch", id});
    EXPECT_EQ(watched.ended, kOk) << watched.out << watched.err;
    return id;
  };
  const std::string first = run(Spec(4));
  const std::string first_weights = dir + "/first.safetensors";
  ASSERT_EQ(cluster().Ctl({"export", first, "-o", first_weights}).ended, kOk);
  // One stage, two replicas (the first ran two stages); another learning
  // rate. Starting from the first job's weights, and the same spec without.
  auto tuned_spec = [&](const std::string& path, const std::string& init) {
    std::ofstream(path) << R"({"name": "tuned",
      "model": {"kind": "gpt", "vocab_size": 16, "context": 12, "d_model": 32, "n_heads": 2, "n_layers": 3},
      "data": {"kind": "addition", "digits": 2},
      "train": {"steps": 3, "global_batch": 8, "micro_batches": 2, "seed": 7,
                "optimizer": {"kind": "adamw", "lr": 0.001}},
      "parallel": {"pipeline_stages": 1, "data_parallel": 2})"
                        << init << "}";
    return path;
  };
  const std::string spec = tuned_spec(dir + "/from-first.json", R"(, "init": {"from_job": ")" + first + R"("})");
  const std::string plain = tuned_spec(dir + "/plain.json", "");
  const std::string tuned = run(spec);
  const CtlRun described = cluster().Ctl({"describe", "job", tuned});
  EXPECT_NE(described.out.find("Started at: the weights of " + first + " at its step 4\n"), std::string::npos)
      << described.out;
  const std::string tuned_weights = dir + "/tuned.safetensors";
  ASSERT_EQ(cluster().Ctl({"export", tuned, "-o", tuned_weights}).ended, kOk);

  EXPECT_EQ(RunToEnd({kBin + "/shardline-train", spec, "--threads=1", "--out=" + dir + "/no.safetensors"},
                     dir + "/train-no-init.log", 60, dir + "/train-no-init.err"),
            kInvalid);
  EXPECT_NE(common::ReadFile(dir + "/train-no-init.err").value_or("").find("--init_weights=FILE"), std::string::npos);
  ASSERT_EQ(RunToEnd({kBin + "/shardline-train", spec, "--threads=1", "--init_weights=" + first_weights,
                      "--out=" + dir + "/tuned-ref.safetensors"},
                     dir + "/train-init.log", 120),
            kOk);
  auto got = common::ReadSafetensors(tuned_weights);
  auto want = common::ReadSafetensors(dir + "/tuned-ref.safetensors");
  auto start = common::ReadSafetensors(first_weights);
  ASSERT_TRUE(got.ok() && want.ok() && start.ok()) << got.status() << want.status() << start.status();
  ExpectSameWeights(*got, *want, "started from the other job");
  bool moved = false;
  for (const auto& [name, tensor] : got->tensors) {
    const common::Tensor& initial = start->tensors.at(name);
    const auto a = tensor.values<float>(), s = initial.values<float>();
    moved |= !std::equal(a.begin(), a.end(), s.begin(), s.end());
  }
  EXPECT_TRUE(moved) << "it trained on from there";

  // The same start sent as a file (submit --init_weights): the same bits.
  const size_t jobs_before =
      FromJson<shardline::v1::ListJobsResponse>(cluster().Ctl({"-o", "json", "get", "jobs"}).out).jobs_size();
  const CtlRun sent = cluster().Ctl({"-o", "json", "submit", plain, "--init_weights=" + first_weights});
  ASSERT_EQ(sent.ended, kOk) << sent.err;
  const std::string sent_id = FromJson<shardline::v1::JobStatus>(sent.out).job_id();
  ASSERT_EQ(cluster().Ctl({"watch", sent_id}).ended, kOk);
  EXPECT_NE(cluster().Ctl({"describe", "job", sent_id}).out.find(
                "Started at: the weights sent with it (step 4 of what trained them)\n"),
            std::string::npos);
  ASSERT_EQ(cluster().Ctl({"export", sent_id, "-o", dir + "/sent.safetensors"}).ended, kOk);
  auto from_file = common::ReadSafetensors(dir + "/sent.safetensors");
  ASSERT_TRUE(from_file.ok()) << from_file.status();
  ExpectSameWeights(*from_file, *want, "started from the file sent");
  // The same tensors from elsewhere, with no __metadata__ naming a model or
  // step: checked against the model's layout, and the same bits.
  common::SafetensorsContents bare;
  bare.tensors = start->tensors;
  ASSERT_TRUE(common::WriteFileAtomically(dir + "/bare.safetensors", *common::SerializeSafetensors(bare)).ok());
  const CtlRun sent_bare = cluster().Ctl({"-o", "json", "submit", plain, "--init_weights=" + dir + "/bare.safetensors"});
  ASSERT_EQ(sent_bare.ended, kOk) << sent_bare.err;
  const std::string bare_id = FromJson<shardline::v1::JobStatus>(sent_bare.out).job_id();
  ASSERT_EQ(cluster().Ctl({"watch", bare_id}).ended, kOk);
  EXPECT_NE(cluster().Ctl({"describe", "job", bare_id}).out.find("Started at: the weights sent with it\n"),
            std::string::npos);
  ASSERT_EQ(cluster().Ctl({"export", bare_id, "-o", dir + "/bare-out.safetensors"}).ended, kOk);
  auto from_bare = common::ReadSafetensors(dir + "/bare-out.safetensors");
  ASSERT_TRUE(from_bare.ok()) << from_bare.status();
  ExpectSameWeights(*from_bare, *want, "started from a file without metadata");
  // Tensors that do not fit the model, with or without a spec naming it.
  common::SafetensorsContents short_one = bare;
  short_one.tensors.erase("ln_f.bias");
  ASSERT_TRUE(
      common::WriteFileAtomically(dir + "/short.safetensors", *common::SerializeSafetensors(short_one)).ok());
  short_one.metadata = start->metadata;
  short_one.tensors.erase("blocks.0.mlp.fc.weight");
  ASSERT_TRUE(
      common::WriteFileAtomically(dir + "/short-spec.safetensors", *common::SerializeSafetensors(short_one)).ok());

  // Refused, nothing kept: both starts, a file that is no weights, none,
  // weights short of the model's.
  const std::vector<std::pair<std::vector<std::string>, std::string>> refusals = {
      {{"submit", spec, "--init_weights=" + first_weights}, "both say where the job starts"},
      {{"submit", plain, "--init_weights=" + spec}, "the weights sent"},
      {{"submit", plain, "--init_weights=" + dir + "/none.safetensors"}, "cannot read"},
      {{"submit", plain, "--init_weights=" + dir}, "cannot read"},
      {{"submit", plain, "--init_weights=" + dir + "/short.safetensors"},
       "the weights sent do not fit the spec's model"},
      {{"submit", plain, "--init_weights=" + dir + "/short-spec.safetensors"},
       "they lack 2 of its"}};
  for (const auto& [args, why] : refusals) {
    const CtlRun refused = cluster().Ctl(args);
    EXPECT_EQ(refused.ended, kInvalid) << args.back() << ": " << refused.err;
    EXPECT_NE(refused.err.find(why), std::string::npos) << refused.err;
  }
  EXPECT_EQ(FromJson<shardline::v1::ListJobsResponse>(cluster().Ctl({"-o", "json", "get", "jobs"}).out).jobs_size(),
            jobs_before + 2);

  // Weights of another model: from the coordinator, sent, and from a file.
  auto other_model = [&](const std::string& from, const std::string& to) {
    std::string text = common::ReadFile(from).value_or("");
    text.replace(text.find("\"n_layers\": 3"), 13, "\"n_layers\": 2");
    std::ofstream(to) << text;
    return to;
  };
  const CtlRun refused = cluster().Ctl({"submit", other_model(spec, dir + "/other-model.json")});
  EXPECT_EQ(refused.ended, kFailed);
  EXPECT_NE(refused.err.find("its weights fit only the same model"), std::string::npos) << refused.err;
  const CtlRun refused_sent =
      cluster().Ctl({"submit", other_model(plain, dir + "/other-plain.json"), "--init_weights=" + first_weights});
  EXPECT_EQ(refused_sent.ended, kFailed);
  EXPECT_NE(refused_sent.err.find("they fit only the same model"), std::string::npos) << refused_sent.err;
  EXPECT_EQ(RunToEnd({kBin + "/shardline-train", dir + "/other-model.json", "--threads=1",
                      "--init_weights=" + first_weights},
                     dir + "/train-other.log", 60, dir + "/train-other.err"),
            kInvalid);
  EXPECT_NE(common::ReadFile(dir + "/train-other.err").value_or("").find("tensors it does not have ('blocks.2."),
            std::string::npos);
}

}  // namespace
}  // namespace shardline::client
