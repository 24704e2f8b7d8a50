// A checkpoint directory's text files (parallel/checkpoint.h): the first input byte picks which
// file gets the rest -- iter_0000001/meta.json (with latest_checkpointed_iteration.txt = 1) or the
// latest file itself (beside an iter_0000001 holding a valid-looking empty meta) -- then the
// one-rank CheckpointReader opens the directory as a resume would.
#include "fuzz_common.h"
#include "parallel/checkpoint.h"
#include "parallel/comm.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t n) {
  if (n < 1) return 0;
  const std::string dir = tpt::fuzz::scratch() + "/ckpt";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir + "/iter_0000001");
  const std::string meta = dir + "/iter_0000001/meta.json", latest = dir + "/latest_checkpointed_iteration.txt";
  static const std::string one = "1\n", empty_meta = "{}";
  if (data[0] % 2 == 0) {
    tpt::fuzz::write_file(meta, data + 1, n - 1);
    tpt::fuzz::write_file(latest, reinterpret_cast<const uint8_t*>(one.data()), one.size());
  } else {
    tpt::fuzz::write_file(latest, data + 1, n - 1);
    tpt::fuzz::write_file(meta, reinterpret_cast<const uint8_t*>(empty_meta.data()), empty_meta.size());
  }
  static std::unique_ptr<tpt::Comm> self = tpt::make_self_comm();
  tpt::fuzz::expect_input_errors_only([&] {
    tpt::LoadRequest req;
    req.dir = dir;
    (void)tpt::CheckpointReader::open(*self, req);
  });
  return 0;
}
