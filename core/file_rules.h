// The rules for files that tptrain reads because a user or another file names them (docs/ARCHITECTURE.md
// "Reading files"): a path that a file names stays inside the folder it was found in, and every
// input is a regular file (a FIFO would block the run, /dev/zero would grow it until bad_alloc).
// Both are InputErrors (exit 2) naming the file and the entry.
#pragma once
#include <cstdint>
#include <string>

namespace tpt {

// dir + "/" + entry, where `entry` is a file name that the file `named_by` gives (a shard of
// model.safetensors.index.json, ...). InputError "<what>: <named_by>: <field> '<entry>' is ..." when
// entry is empty, absolute or has a ".." component. Checked on the name, not on what it resolves to:
// symlinks inside the folder (the Hugging Face cache's snapshots/<rev>/x -> ../../blobs/<hash>) keep
// working.
std::string confined_path(const std::string& dir, const std::string& entry, const std::string& named_by,
                          const std::string& field, const std::string& what);

// What a file of this st_mode is, for messages: "a directory", "a FIFO", "a character device", ...
const char* file_kind(unsigned mode);

// InputError "<what>: <path>: not a regular file (<kind>)" unless path is a regular file (or a link
// to one), "<what>: cannot open <path>: <reason>" when it cannot be looked at. Never blocks on a FIFO.
void check_regular_file(const std::string& path, const std::string& what);

// The whole of a regular file (check_regular_file's rule), at most max_bytes: InputError "<what>:
// <path> is larger than <max_bytes> bytes" past that, "<what>: cannot read <path>: <reason>".
std::string read_regular_file(const std::string& path, const std::string& what, uint64_t max_bytes);

}  // namespace tpt
