#include "data/doc_masks.h"

namespace tpt {

void document_positions(const int32_t* tokens, int64_t S, int32_t eod, int32_t* positions) {
  int64_t start = 0;  // where the current document began inside the sample
  for (int64_t t = 0; t < S; ++t) {
    positions[t] = static_cast<int32_t>(t - start);
    if (tokens[t] == eod) start = t + 1;
  }
}

int64_t eod_loss_mask(const int32_t* tokens, int64_t S, int32_t eod, float* weights) {
  int64_t counted = 0;
  for (int64_t t = 0; t < S; ++t) {
    const bool counts = tokens[t] != eod;
    weights[t] = counts ? 1.0f : 0.0f;
    counted += counts;
  }
  return counted;
}

}  // namespace tpt
