// The tokenizer files (data/byte_pair_tokenizer.h, data/bpe_tokenizer.h): the first byte picks the
// reader (0: tiktoken's tokenizer.model, 1: Hugging Face's tokenizer.json, 2: GPT-2's vocab.json
// with an empty merges.txt), the rest is the file; a tokenizer that loads then encodes and decodes
// a short text. Ranks and ids are bounded by the file (issue 42): a huge table is a finding
// (scripts/fuzz.sh runs with -malloc_limit_mb).
#include "data/bpe_tokenizer.h"
#include "data/byte_pair_tokenizer.h"
#include "fuzz_common.h"

#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t n) {
  if (n == 0) return 0;
  const int kind = data[0] % 3;
  const std::string path = tpt::fuzz::scratch() + "/tokenizer.file";
  tpt::fuzz::write_file(path, data + 1, n - 1);
  tpt::fuzz::expect_input_errors_only([&] {
    const std::string text = "Hello world, 123 <|end_of_text|> \xe6\x97\xa5\xe6\x9c\xac\ncafe\xcc\x81 <think>\xff";
    if (kind == 2) {
      const std::string merges = tpt::fuzz::scratch() + "/merges.txt";
      tpt::fuzz::write_file(merges, nullptr, 0);
      const tpt::BpeTokenizer t(path, merges);
      (void)t.encode(text);
      return;
    }
    const tpt::BytePairTokenizer t =
        kind == 0 ? tpt::BytePairTokenizer::from_tiktoken_file(path) : tpt::BytePairTokenizer::from_hf_file(path);
    const std::vector<int32_t> ids = t.encode(text);
    (void)t.decode(ids);
  });
  return 0;
}
