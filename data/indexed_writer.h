// Writes a Megatron indexed dataset (docs/ARCHITECTURE.md "Data formats"): PREFIX.bin (raw tokens)
// and PREFIX.idx. Both are written to temporary files, fsynced, then renamed into place (.bin
// first, .idx last), so a reader never sees a half-written dataset.
#pragma once
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

namespace tpt {

class IndexedDatasetWriter {
 public:
  // dtype_code: Megatron's code of an integer type (1 u8, 2 i8, 3 i16, 4 i32, 5 i64, 8 u16).
  // Throws InputError naming PREFIX.bin if the temporary file cannot be created.
  IndexedDatasetWriter(const std::string& prefix, int dtype_code);
  ~IndexedDatasetWriter();  // removes the temporary files unless finish() succeeded
  IndexedDatasetWriter(const IndexedDatasetWriter&) = delete;
  IndexedDatasetWriter& operator=(const IndexedDatasetWriter&) = delete;

  // Appends one sequence to the current document. Tokens must fit the dtype.
  void add_sequence(std::span<const int32_t> tokens);
  // Closes the current document (all sequences added since the previous end_document()).
  void end_document();
  // One document made of one sequence.
  void add_document(std::span<const int32_t> tokens) {
    add_sequence(tokens);
    end_document();
  }
  // Writes the index and moves both files into place. Sequences added after the last
  // end_document() form a final document.
  void finish();

  int64_t num_documents() const { return static_cast<int64_t>(doc_idx_.size()) - 1; }
  int64_t num_sequences() const { return static_cast<int64_t>(sizes_.size()); }
  int64_t num_tokens() const { return num_tokens_; }

 private:
  std::string prefix_, bin_tmp_, idx_tmp_;
  int dtype_;
  size_t itemsize_;
  std::FILE* bin_ = nullptr;
  std::vector<int32_t> sizes_;
  std::vector<int64_t> pointers_;
  std::vector<int64_t> doc_idx_{0};
  int64_t num_tokens_ = 0, bytes_ = 0;
  std::vector<uint8_t> buffer_;
  bool finished_ = false;
};

}  // namespace tpt
