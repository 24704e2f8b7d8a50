// Megatron's document-aware positions and loss mask (get_ltor_masks_and_position_ids), for one
// sample's S input tokens (data.reset_position_ids, data.eod_mask_loss).
#pragma once
#include <cstdint>

namespace tpt {

// data.reset_position_ids: positions count from 0 and restart after every end-of-document token:
// the EOD itself keeps its document's position, the token after it gets 0.
void document_positions(const int32_t* tokens, int64_t S, int32_t eod, int32_t* positions);

// data.eod_mask_loss, as Megatron computes it (loss_mask[tokens == eod] = 0): the position whose
// *input* token is the end of document -- the prediction of the next document's first token
// from the previous document -- does not count (weight 0); every other position weighs 1.
// Returns the number of positions that count.
int64_t eod_loss_mask(const int32_t* tokens, int64_t S, int32_t eod, float* weights);

}  // namespace tpt
