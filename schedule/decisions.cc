#include "schedule/decisions.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tandem::schedule {

absl::StatusOr<Decisions> DecisionsFromPlan(const tandem::v1::Plan& plan, int num_layers) {
  if (plan.layers_size() != num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("plan.layers: has ", plan.layers_size(),
                                                   " layers, the model has ", num_layers));
  }
  Decisions s;
  s.strategy = plan.strategy();
  s.batch_size = plan.batch_size();
  s.micro_batch_size = plan.micro_batch_size();
  s.accelerator_batch_share = plan.accelerator_batch_share();
  s.delayed_parameter_update = plan.delayed_parameter_update();
  s.host_update_threads = plan.host_update_threads();
  s.state_prefetch_layers = std::max(1, plan.state_prefetch_layers());
  s.state_update_lag = std::max(0, plan.state_update_lag());
  s.layers.resize(num_layers);
  for (int i = 0; i < num_layers; ++i) {
    const tandem::v1::LayerPlan& l = plan.layers(i);
    s.layers[i] = {l.compute(), l.parameter_home(), l.update(), l.activation_policy(),
                   l.stream_optimizer_state()};
  }
  return s;
}

void WriteDecisionsToPlan(const Decisions& schedule, tandem::v1::Plan* plan) {
  plan->set_strategy(schedule.strategy);
  plan->set_batch_size(schedule.batch_size);
  plan->set_micro_batch_size(schedule.micro_batch_size);
  plan->set_micro_batches(schedule.micro_batches());
  plan->set_accelerator_batch_share(schedule.accelerator_batch_share);
  plan->set_delayed_parameter_update(schedule.delayed_parameter_update);
  plan->set_host_update_threads(schedule.host_update_threads);
  plan->set_state_prefetch_layers(schedule.state_prefetch_layers);
  plan->set_state_update_lag(schedule.state_update_lag);
  while (plan->layers_size() < static_cast<int>(schedule.layers.size())) plan->add_layers();
  for (int i = 0; i < static_cast<int>(schedule.layers.size()); ++i) {
    tandem::v1::LayerPlan* l = plan->mutable_layers(i);
    const LayerDecisions& d = schedule.layers[i];
    l->set_index(i);
    l->set_compute(d.compute);
    l->set_parameter_home(d.parameter_home);
    l->set_update(d.update);
    l->set_activation_policy(d.activation);
    l->set_stream_optimizer_state(d.stream_state);
  }
}

}  // namespace tandem::schedule
