// A tiny GPT config built in code, shared by the unit, multi-rank and GPU tests.
#pragma once
#include "core/config.h"

namespace tpt::test {

struct TinyShape {
  int layers = 2, hidden = 16, heads = 2, ffn = 64, seq = 8, vocab = 37, micro_batch = 2;
};

inline Config tiny_gpt_config(const TinyShape& s = {}) {
  Config c;
  c.model.num_layers = s.layers;
  c.model.hidden_size = s.hidden;
  c.model.num_attention_heads = s.heads;
  c.model.ffn_hidden_size = s.ffn;
  c.model.seq_length = s.seq;
  c.model.max_position_embeddings = s.seq;
  c.model.vocab_size = s.vocab;
  c.model.make_vocab_size_divisible_by = 8;
  c.model.layernorm_epsilon = 1e-5;
  c.model.init_method_std = 0.02;
  c.training.micro_batch_size = s.micro_batch;
  c.training.seed = 1234;
  return c;
}

}  // namespace tpt::test
