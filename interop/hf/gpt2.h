// model.init_from: start from Hugging Face GPT-2 weights (safetensors; F32/F16/BF16; names with or
// without the "transformer." prefix; Conv1D weights stored [in, out]; c_attn's columns are q, k, v
// of all heads). Each rank reads only its own box of each tensor.
#pragma once
#include <string>

#include "model/gpt.h"

namespace tpt {

// Our parameter name (e.g. "h.3.attn.qkv.weight") as Hugging Face GPT-2 names it
// ("h.3.attn.c_attn.weight"), and whether HF stores it as a Conv1D weight ([in, out]: our 2-D view
// of it transposed). The one name map of init_from and tptrain export.
struct HFTensor {
  std::string name;
  bool conv1d = false;
};
HFTensor hf_gpt2_name(const std::string& ours);

// Fills the host parameter buffer of this rank's layout. Throws InputError naming the file and
// tensor for a missing tensor or a shape mismatch (with both shapes).
void load_hf_gpt2(const std::string& path, const GPTDims& d, const ParamLayout& layout, float* params);

}  // namespace tpt
