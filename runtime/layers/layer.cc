#include "runtime/layers/layer.h"

#include "absl/strings/str_cat.h"

namespace tandem {

absl::Status Layer::Build(const Shape& input) {
  absl::StatusOr<Shape> output = InferOutput(input);
  if (!output.ok()) {
    return absl::Status(output.status().code(),
                        absl::StrCat(kind(), " layer '", name_, "' with input ", input.ToString(),
                                     ": ", output.status().message()));
  }
  input_shape_ = input;
  output_shape_ = *output;
  return absl::OkStatus();
}

int64_t Layer::ParamCount() const {
  int64_t n = 0;
  for (const ParamSpec& p : Params()) n += p.shape.elements();
  return n;
}

}  // namespace tandem
