// Job files: YAML and JSON parsing, validation errors naming the field, defaults.
#include "spec/job_spec.h"

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

const char kValid[] = R"(
display_name: "123"
model: {mlp: {}}
data: {synthetic: {sample_shape: [8], num_classes: 3}}
training: {batch_size: 4, steps: 2}
)";

TEST(JobSpecTest, YamlAndJsonGiveTheSameSpec) {
  absl::StatusOr<tandem::v1::JobSpec> yaml = ParseJobSpec(kValid, "job.yaml");
  ASSERT_TRUE(yaml.ok()) << yaml.status();
  EXPECT_EQ(yaml->display_name(), "123");  // Quoted: stays a string.
  absl::StatusOr<tandem::v1::JobSpec> json = ParseJobSpec(
      R"({"displayName": "123", "model": {"mlp": {}}, "data": {"synthetic": {"sampleShape": [8],
          "numClasses": 3}}, "training": {"batchSize": 4, "steps": "2"}})",
      "job.json");
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ(yaml->SerializeAsString(), json->SerializeAsString());
}

TEST(JobSpecTest, UnknownFieldsAndEnumsAreRejected) {
  absl::Status s = ParseJobSpec("model: {mlp: {}}\nbatch: 3\n", "x.yaml").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("batch"), std::string::npos) << s;
  s = ParseJobSpec("optimizer: {kind: OPTIMIZER_KIND_LION}\n", "x.yaml").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("OPTIMIZER_KIND_LION"), std::string::npos) << s;
}

TEST(JobSpecTest, YamlSyntaxErrorsGiveTheLine) {
  const absl::Status s = ParseJobSpec("model:\n  mlp: {\n", "bad.yaml").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("bad.yaml:"), std::string::npos) << s;
}

struct BadCase {
  const char* yaml;
  const char* field;
};

class InvalidSpecTest : public testing::TestWithParam<BadCase> {};

TEST_P(InvalidSpecTest, NamesTheField) {
  absl::StatusOr<tandem::v1::JobSpec> spec = ParseJobSpec(kValid, "job.yaml");
  ASSERT_TRUE(spec.ok());
  absl::StatusOr<tandem::v1::JobSpec> patch = ParseJobSpec(GetParam().yaml, "patch.yaml");
  ASSERT_TRUE(patch.ok()) << patch.status();
  spec->MergeFrom(*patch);
  const absl::Status s = ResolveJobSpec(*spec, false).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find(GetParam().field), std::string::npos) << s;
}

INSTANTIATE_TEST_SUITE_P(
    Fields, InvalidSpecTest,
    testing::Values(
        BadCase{"training: {batch_size: -1}", "training.batch_size"},
        BadCase{"training: {batch_size: 100000}", "training.batch_size"},
        BadCase{"training: {steps: -5}", "training.steps"},
        BadCase{"training: {epochs: -1}", "training.epochs"},
        BadCase{"optimizer: {learning_rate: -1}", "optimizer.learning_rate"},
        BadCase{"optimizer: {beta1: 1.5}", "optimizer.beta1"},
        BadCase{"optimizer: {weight_decay: -0.1}", "optimizer.weight_decay"},
        BadCase{"placement: {micro_batch_size: 3}", "placement.micro_batch_size"},
        BadCase{"placement: {strategy: STRATEGY_GPU_ONLY, accelerator: ACCELERATOR_KIND_NONE}",
                "placement.strategy"},
        BadCase{"resources: {host_memory_bytes: -1}", "resources.host_memory_bytes"},
        BadCase{"priority: 5000", "priority"},
        BadCase{"training: {threads: -2}", "training.threads"},
        // Data-parallel ranks with an accelerator: the emulated one, replicated, over Gloo.
        BadCase{"distributed: {replicas: 2}\nplacement: {accelerator: ACCELERATOR_KIND_CUDA}",
                "distributed.replicas"},
        BadCase{"distributed: {replicas: 2}\nplacement: {accelerator: ACCELERATOR_KIND_EMULATED, "
                "strategy: STRATEGY_HETERO_DP}",
                "placement.strategy"},
        BadCase{"distributed: {replicas: 2, backend: COLLECTIVE_BACKEND_NCCL}\n"
                "placement: {accelerator: ACCELERATOR_KIND_EMULATED}",
                "distributed.backend"},
        // A rank waits on the rendezvous table an hour at most.
        BadCase{"distributed: {replicas: 2, rendezvous_timeout_seconds: 7200}",
                "distributed.rendezvous_timeout_seconds"},
        // Loss scaling: fp16 jobs alone, a scale a float divides by, fp16
        // refused where a skipped step could not reach the scaler.
        BadCase{"training: {loss_scaling: {initial_scale: 1024}}", "training.loss_scaling"},
        BadCase{"precision: PRECISION_BF16\ntraining: {loss_scaling: {growth_interval_steps: 5}}",
                "training.loss_scaling"},
        BadCase{"precision: PRECISION_FP16\ntraining: {loss_scaling: {initial_scale: 1e-9}}",
                "training.loss_scaling.initial_scale"},
        BadCase{"precision: PRECISION_FP16\ntraining: {loss_scaling: {max_consecutive_skips: -1}}",
                "training.loss_scaling.max_consecutive_skips"},
        BadCase{"precision: PRECISION_FP16\nupdates: {easgd: {}}", "updates.easgd"},
        BadCase{"precision: PRECISION_FP16\ndistributed: {replicas: 2}", "precision"}));

TEST(JobSpecTest, Fp16GetsLossScalingDefaults) {
  absl::StatusOr<tandem::v1::JobSpec> spec =
      ParseJobSpec(std::string(kValid) + "precision: PRECISION_FP16\n", "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<tandem::v1::JobSpec> r = ResolveJobSpec(*spec, false);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->training().loss_scaling().initial_scale(), 65536);
  EXPECT_EQ(r->training().loss_scaling().growth_interval_steps(), 2000);
  EXPECT_EQ(r->training().loss_scaling().max_consecutive_skips(), 100);
  // Other precisions carry none.
  absl::StatusOr<tandem::v1::JobSpec> fp32 = ResolveJobSpec(*ParseJobSpec(kValid, "j.yaml"), false);
  ASSERT_TRUE(fp32.ok());
  EXPECT_FALSE(fp32->training().has_loss_scaling());
}

TEST(JobSpecTest, RanksWithAnEmulatedAcceleratorPartitionTheirHostStateOverGloo) {
  absl::StatusOr<tandem::v1::JobSpec> spec = ParseJobSpec(kValid, "job.yaml");
  ASSERT_TRUE(spec.ok());
  absl::StatusOr<tandem::v1::JobSpec> patch = ParseJobSpec(
      "distributed: {replicas: 2}\nplacement: {accelerator: ACCELERATOR_KIND_EMULATED}", "p.yaml");
  ASSERT_TRUE(patch.ok()) << patch.status();
  spec->MergeFrom(*patch);
  absl::StatusOr<tandem::v1::JobSpec> r = ResolveJobSpec(*spec, false);
  ASSERT_TRUE(r.ok()) << r.status();
  // Adam is partitioned (AUTO), as on the CPU engine: the ranks cut the
  // state their plans keep on the host.
  EXPECT_EQ(r->distributed().sharding(), tandem::v1::OPTIMIZER_SHARDING_PARTITIONED);
  EXPECT_EQ(r->distributed().backend(), tandem::v1::COLLECTIVE_BACKEND_GLOO);
  EXPECT_EQ(r->placement().strategy(), tandem::v1::STRATEGY_REUSE_DISTANCE);
  // Plain SGD has no state to cut.
  spec->mutable_optimizer()->set_kind(tandem::v1::OPTIMIZER_KIND_SGD);
  spec->mutable_optimizer()->set_momentum(0);
  r = ResolveJobSpec(*spec, false);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->distributed().sharding(), tandem::v1::OPTIMIZER_SHARDING_REPLICATED);
}

TEST(JobSpecTest, CyclicAndExplodingAliasesAreRefused) {
  // job_spec_fuzz's crash: an alias inside the mapping it names.
  absl::Status s = ParseJobSpec("labels: &b {batching: *b}\n", "cycle.yaml").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("cycle.yaml: nested more than 64 levels deep"), std::string::npos)
      << s;
  // Each level doubles the last: 2^30 copies of the first.
  std::string bomb = "a0: &a0 [xxxxxxxxxxxxxxxx, xxxxxxxxxxxxxxxx]\n";
  for (int i = 1; i <= 30; ++i) {
    bomb += absl::StrCat("a", i, ": &a", i, " [*a", i - 1, ", *a", i - 1, "]\n");
  }
  s = ParseJobSpec(bomb, "bomb.yaml").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("bomb.yaml: expands to more than 16 MiB through aliases"),
            std::string::npos)
      << s;
}

TEST(JobSpecTest, MissingModelAndDataAreNamed) {
  tandem::v1::JobSpec spec;
  spec.mutable_training()->set_batch_size(1);
  spec.mutable_training()->set_steps(1);
  EXPECT_NE(ValidateJobSpec(spec).message().find("model"), std::string::npos);
  spec.mutable_model()->mutable_mlp();
  EXPECT_NE(ValidateJobSpec(spec).message().find("data"), std::string::npos);
}

TEST(JobSpecTest, AnOversizedSpecIsRefusedNamingItsLargestField) {
  absl::StatusOr<tandem::v1::JobSpec> spec = ParseJobSpec(kValid, "job.yaml");
  ASSERT_TRUE(spec.ok());
  tandem::v1::Plan* plan = spec->mutable_placement()->mutable_plan();
  for (int l = 0; l < 20000; ++l) plan->add_layers()->set_name(std::string(60, 'x'));
  ASSERT_GT(spec->ByteSizeLong(), size_t{1} << 20);
  const absl::Status s = ResolveJobSpec(*spec, false).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("placement: the spec is"), std::string::npos) << s;
  // Just under the limit it is not the size that is refused.
  plan->mutable_layers()->DeleteSubrange(0, 19000);
  EXPECT_EQ(ResolveJobSpec(*spec, false).status().message().find("the spec is"), std::string::npos);
}

TEST(JobSpecTest, ResolveFillsDefaults) {
  absl::StatusOr<tandem::v1::JobSpec> spec = ParseJobSpec(kValid, "job.yaml");
  ASSERT_TRUE(spec.ok());
  absl::StatusOr<tandem::v1::JobSpec> r = ResolveJobSpec(*spec, /*has_accelerator=*/false);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->optimizer().kind(), tandem::v1::OPTIMIZER_KIND_ADAM);
  EXPECT_FLOAT_EQ(r->optimizer().learning_rate(), 1e-3f);
  EXPECT_FLOAT_EQ(r->optimizer().beta2(), 0.999f);
  EXPECT_EQ(r->training().checkpoint_interval_steps(), 500);
  EXPECT_EQ(r->training().eval_batch_size(), 4);
  EXPECT_TRUE(r->data().shuffle());
  EXPECT_EQ(r->placement().strategy(), tandem::v1::STRATEGY_CPU_ONLY);
  absl::StatusOr<tandem::v1::JobSpec> gpu = ResolveJobSpec(*spec, /*has_accelerator=*/true);
  EXPECT_EQ(gpu->placement().strategy(), tandem::v1::STRATEGY_REUSE_DISTANCE);
}

// Resolves kValid with `updates` (YAML flow mapping) added.
absl::StatusOr<tandem::v1::JobSpec> ResolveWithUpdates(const std::string& updates,
                                                       bool has_accelerator = false,
                                                       const std::string& extra = "") {
  absl::StatusOr<tandem::v1::JobSpec> spec =
      ParseJobSpec(absl::StrCat(kValid, "updates: ", updates, "\n", extra), "job.yaml");
  if (!spec.ok()) return spec.status();
  return ResolveJobSpec(*spec, has_accelerator);
}

TEST(JobSpecTest, UpdateRulesGetTheirDefaults) {
  absl::StatusOr<tandem::v1::JobSpec> plain =
      ResolveJobSpec(*ParseJobSpec(kValid, "j.yaml"), false);
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(plain->updates().has_synchronous());
  absl::StatusOr<tandem::v1::JobSpec> h = ResolveWithUpdates("{hogwild: {}}", true);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->updates().hogwild().workers(), 2);
  // The workers are CPU threads even where the node has an accelerator.
  EXPECT_EQ(h->placement().strategy(), tandem::v1::STRATEGY_CPU_ONLY);
  absl::StatusOr<tandem::v1::JobSpec> e = ResolveWithUpdates("{easgd: {}}");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->updates().easgd().replicas(), 2);
  EXPECT_FLOAT_EQ(e->updates().easgd().alpha(), 0.1f);
  EXPECT_EQ(e->updates().easgd().period(), 4);
  absl::StatusOr<tandem::v1::JobSpec> ps = ResolveWithUpdates("{parameter_server: {staleness: 0}}");
  ASSERT_TRUE(ps.ok()) << ps.status();
  EXPECT_TRUE(ps->updates().parameter_server().has_staleness());
  EXPECT_EQ(ps->updates().parameter_server().staleness(), 0);  // 0 is kept, not defaulted
  EXPECT_EQ(ps->updates().parameter_server().shards(), 4);
  absl::StatusOr<tandem::v1::JobSpec> swa = ResolveWithUpdates("{swa: {start_step: 2}}");
  ASSERT_TRUE(swa.ok()) << swa.status();
  EXPECT_EQ(swa->updates().swa().period(), 1);
}

TEST(JobSpecTest, BadUpdateRuleParametersNameTheField) {
  const std::pair<const char*, const char*> cases[] = {
      {"{easgd: {alpha: 1.5}}", "updates.easgd.alpha: must be in (0, 1)"},
      {"{easgd: {alpha: 0}}", "updates.easgd.alpha: must be in (0, 1)"},
      {"{easgd: {period: 0}}", "updates.easgd.period: must be in [1,"},
      {"{parameter_server: {staleness: -1}}", "updates.parameter_server.staleness: must be in [0,"},
      {"{parameter_server: {shards: 300}}", "updates.parameter_server.shards"},
      {"{hogwild: {workers: 65}}", "updates.hogwild.workers"},
      {"{swa: {start_step: 3}}", "updates.swa.start_step: 3 is after the run's last step"},
      {"{swa: {start_step: 1, period: 0}}", "updates.swa.period"},
  };
  for (const auto& [updates, error] : cases) {
    absl::StatusOr<tandem::v1::JobSpec> r = ResolveWithUpdates(updates);
    ASSERT_FALSE(r.ok()) << updates;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << updates;
    EXPECT_NE(r.status().message().find(error), std::string::npos) << r.status();
  }
  absl::StatusOr<tandem::v1::JobSpec> offload =
      ResolveWithUpdates("{hogwild: {}}", true, "placement: {strategy: STRATEGY_ZERO_OFFLOAD}\n");
  ASSERT_FALSE(offload.ok());
  EXPECT_NE(offload.status().message().find("updates.hogwild: its workers run on the CPU engine"),
            std::string::npos)
      << offload.status();
}

// kValid (batch 4) with `placement` (YAML flow mapping) on a node with an accelerator.
absl::StatusOr<tandem::v1::JobSpec> ResolveWithPlacement(const std::string& placement,
                                                         const std::string& extra = "") {
  absl::StatusOr<tandem::v1::JobSpec> spec =
      ParseJobSpec(absl::StrCat(kValid, "placement: ", placement, "\n", extra), "job.yaml");
  if (!spec.ok()) return spec.status();
  return ResolveJobSpec(*spec, /*has_accelerator=*/true);
}

TEST(JobSpecTest, PipelinesGetTheirDefaults) {
  absl::StatusOr<tandem::v1::JobSpec> r =
      ResolveWithPlacement("{accelerator: ACCELERATOR_KIND_EMULATED, pipeline: {stages: 2}}");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->placement().strategy(), tandem::v1::STRATEGY_GPU_ONLY);
  EXPECT_EQ(r->placement().pipeline().schedule(), tandem::v1::PIPELINE_SCHEDULE_ONE_F_ONE_B);
  EXPECT_EQ(r->placement().pipeline().micro_batches(), 4);  // min(batch 4, 4 x stages)
  EXPECT_EQ(r->placement().micro_batch_size(), 1);
  absl::StatusOr<tandem::v1::JobSpec> mb = ResolveWithPlacement(
      "{accelerator: ACCELERATOR_KIND_EMULATED, micro_batch_size: 2, pipeline: {stages: 3}}");
  ASSERT_TRUE(mb.ok()) << mb.status();
  EXPECT_EQ(mb->placement().pipeline().micro_batches(), 2);
  // Pipelines run fp32 unless asked for bf16: auto resolves to fp32, bf16
  // stays, fp16 is refused naming the field.
  EXPECT_EQ(mb->precision(), tandem::v1::PRECISION_FP32);
  absl::StatusOr<tandem::v1::JobSpec> bf16 =
      ResolveWithPlacement("{accelerator: ACCELERATOR_KIND_EMULATED, pipeline: {stages: 2}}",
                           "precision: PRECISION_BF16\n");
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_EQ(bf16->precision(), tandem::v1::PRECISION_BF16);
  absl::StatusOr<tandem::v1::JobSpec> fp16 =
      ResolveWithPlacement("{accelerator: ACCELERATOR_KIND_EMULATED, pipeline: {stages: 2}}",
                           "precision: PRECISION_FP16\n");
  ASSERT_FALSE(fp16.ok());
  EXPECT_NE(fp16.status().message().find("precision: a pipeline"), std::string::npos)
      << fp16.status();
  // One stage is no pipeline: the spec resolves as it always did.
  absl::StatusOr<tandem::v1::JobSpec> one = ResolveWithPlacement("{pipeline: {stages: 1}}");
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->placement().strategy(), tandem::v1::STRATEGY_REUSE_DISTANCE);
}

// auto_stages: checked as a pipeline would be, resolved in fp32 with the
// one-accelerator candidate's strategy; ResolvePipelineStages then makes it
// the spec of the stages chosen.
TEST(JobSpecTest, AutoStagesResolveAsAPipelineOnceChosen) {
  absl::StatusOr<tandem::v1::JobSpec> r = ResolveWithPlacement(
      "{accelerator: ACCELERATOR_KIND_EMULATED, pipeline: {auto_stages: true}}");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->precision(), tandem::v1::PRECISION_FP32);
  EXPECT_EQ(r->placement().strategy(), tandem::v1::STRATEGY_REUSE_DISTANCE);
  EXPECT_EQ(r->placement().pipeline().stages(), 0);
  tandem::v1::JobSpec four = *r;
  ASSERT_TRUE(ResolvePipelineStages(four, 4).ok());
  EXPECT_FALSE(four.placement().pipeline().auto_stages());
  EXPECT_EQ(four.placement().pipeline().stages(), 4);
  EXPECT_EQ(four.placement().strategy(), tandem::v1::STRATEGY_GPU_ONLY);
  EXPECT_EQ(four.placement().pipeline().micro_batches(), 4);
  EXPECT_EQ(four.placement().pipeline().schedule(), tandem::v1::PIPELINE_SCHEDULE_ONE_F_ONE_B);
  // Resolving it again changes nothing (the trainer resolves what it is given).
  absl::StatusOr<tandem::v1::JobSpec> again = ResolveJobSpec(*r, true);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->SerializeAsString(), r->SerializeAsString());
  tandem::v1::JobSpec one = *r;
  ASSERT_TRUE(ResolvePipelineStages(one, 1).ok());
  EXPECT_FALSE(one.placement().pipeline().auto_stages());
  EXPECT_EQ(one.placement().pipeline().stages(), 0);
  EXPECT_EQ(one.placement().strategy(), tandem::v1::STRATEGY_REUSE_DISTANCE);

  const std::pair<const char*, const char*> cases[] = {
      {"{pipeline: {auto_stages: true, stages: 2}}",
       "placement.pipeline.auto_stages: tandemd chooses the stages, and "
       "placement.pipeline.stages asks for 2"},
      {"{accelerator: ACCELERATOR_KIND_NONE, pipeline: {auto_stages: true}}",
       "placement.pipeline.auto_stages: a pipeline runs on accelerators"},
      {"{delayed_parameter_update: true, pipeline: {auto_stages: true}}",
       "placement.delayed_parameter_update: a pipeline updates on its stages"},
  };
  for (const auto& [placement, error] : cases) {
    absl::StatusOr<tandem::v1::JobSpec> bad = ResolveWithPlacement(placement);
    ASSERT_FALSE(bad.ok()) << placement;
    EXPECT_NE(bad.status().message().find(error), std::string::npos) << bad.status();
  }
  absl::StatusOr<tandem::v1::JobSpec> fp16 =
      ResolveWithPlacement("{pipeline: {auto_stages: true}}", "precision: PRECISION_FP16\n");
  ASSERT_FALSE(fp16.ok());
  EXPECT_NE(fp16.status().message().find("precision: a pipeline (placement.pipeline.auto_stages)"),
            std::string::npos)
      << fp16.status();
}

TEST(JobSpecTest, BadPipelinesNameTheField) {
  const std::pair<const char*, const char*> cases[] = {
      {"{pipeline: {stages: 65}}", "placement.pipeline.stages: must be in [0, 64]"},
      {"{pipeline: {stages: 2, micro_batches: 3}}",
       "placement.pipeline.micro_batches: 3 does not divide training.batch_size 4"},
      {"{pipeline: {stages: 2, micro_batches: 4}, micro_batch_size: 2}",
       "placement.pipeline.micro_batches: 4 micro-batches of placement.micro_batch_size 2"},
      {"{pipeline: {stages: 2, schedule: 9}}", "placement.pipeline.schedule: unknown value 9"},
      {"{pipeline: {stages: 2, vertical_sync: true}}",
       "placement.pipeline.vertical_sync: only PipeDream"},
      {"{pipeline: {stages: 2, schedule: PIPELINE_SCHEDULE_GPIPE, vertical_sync: true}}",
       "placement.pipeline.vertical_sync: only PipeDream"},
      {"{pipeline: {stages: 2, continuous: true}}",
       "placement.pipeline.continuous: only PipeDream"},
      {"{pipeline: {stages: 2, schedule: PIPELINE_SCHEDULE_PIPEDREAM, vertical_sync: true, "
       "continuous: true}}",
       "placement.pipeline.continuous: only PipeDream"},
      {"{accelerator: ACCELERATOR_KIND_NONE, pipeline: {stages: 2}}",
       "placement.pipeline.stages: a pipeline runs on accelerators"},
      {"{strategy: STRATEGY_ZERO_OFFLOAD, pipeline: {stages: 2}}",
       "STRATEGY_ZERO_OFFLOAD within pipeline stages is not built"},
      {"{delayed_parameter_update: true, pipeline: {stages: 2}}",
       "placement.delayed_parameter_update: a pipeline updates on its stages"},
  };
  for (const auto& [placement, error] : cases) {
    absl::StatusOr<tandem::v1::JobSpec> r = ResolveWithPlacement(placement);
    ASSERT_FALSE(r.ok()) << placement;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << placement;
    EXPECT_NE(r.status().message().find(error), std::string::npos) << r.status();
  }
  absl::StatusOr<tandem::v1::JobSpec> clipped =
      ResolveWithPlacement("{pipeline: {stages: 2, schedule: PIPELINE_SCHEDULE_PIPEDREAM}}",
                           "optimizer: {max_grad_norm: 1.0}\n");
  ASSERT_FALSE(clipped.ok());
  EXPECT_NE(clipped.status().message().find(
                "placement.pipeline.schedule: PipeDream updates each stage on its own"),
            std::string::npos)
      << clipped.status();
  absl::StatusOr<tandem::v1::JobSpec> hogwild =
      ResolveWithPlacement("{pipeline: {stages: 2}}", "updates: {easgd: {}}\n");
  ASSERT_FALSE(hogwild.ok());
  EXPECT_NE(hogwild.status().message().find("a pipeline updates synchronously"), std::string::npos)
      << hogwild.status();
}

}  // namespace
}  // namespace tandem
