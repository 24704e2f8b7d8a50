// The token data readers (data/dataset.h): the first input byte picks the format, the rest is the
// file -- a Megatron .idx (with a fixed .bin of 4096 bytes beside it) or an llm.c shard; then the
// documents are read.
#include "data/dataset.h"
#include "fuzz_common.h"

#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t n) {
  if (n < 1) return 0;
  const bool megatron = data[0] % 2 == 0;
  const std::string dir = tpt::fuzz::scratch();
  std::string path;
  if (megatron) {
    static const std::vector<uint8_t> bin(4096, 7);
    path = dir + "/corpus";
    tpt::fuzz::write_file(path + ".idx", data + 1, n - 1);
    tpt::fuzz::write_file(path + ".bin", bin.data(), bin.size());
  } else {
    path = dir + "/shard.bin";
    tpt::fuzz::write_file(path, data + 1, n - 1);
  }
  tpt::fuzz::expect_input_errors_only([&] {
    auto corpus = tpt::open_corpus(path, 65536);
    std::vector<int32_t> tokens(64);
    for (int64_t d = 0; d < corpus->num_documents() && d < 64; ++d) {
      const int64_t len = std::min<int64_t>(corpus->document_length(d), 64);
      corpus->read(d, 0, len, tokens.data());
    }
  });
  return 0;
}
