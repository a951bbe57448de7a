#include "runtime/exec/step_runner.h"

namespace tandem {

int64_t CountCorrect(const float* logits, const int32_t* targets, int64_t rows, int64_t classes) {
  int64_t correct = 0;
#pragma omp parallel for reduction(+ : correct) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = logits + r * classes;
    int64_t best = 0;
    for (int64_t c = 1; c < classes; ++c) {
      if (row[c] > row[best]) best = c;
    }
    if (best == targets[r]) ++correct;
  }
  return correct;
}

}  // namespace tandem
