#include "train/tensorboard.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "train/aux_output.h"

namespace tpt {

namespace {

const std::array<uint32_t, 256>& crc_table() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  return table;
}

// protobuf wire format: keys are (field << 3) | wire type; 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out += char(uint8_t(v) | 0x80);
    v >>= 7;
  }
  out += char(uint8_t(v));
}

void put_fixed(std::string& out, const void* p, size_t n) {  // little-endian hosts (x86, arm64)
  out.append(static_cast<const char*>(p), n);
}

void put_bytes(std::string& out, int field, const std::string& bytes) {
  put_varint(out, uint64_t(field) << 3 | 2);
  put_varint(out, bytes.size());
  out += bytes;
}

void put_wall_time(std::string& out, double wall_time) {
  put_varint(out, 1 << 3 | 1);  // Event.wall_time: double
  put_fixed(out, &wall_time, 8);
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  const auto& t = crc_table();
  const auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = t[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string tfrecord(const std::string& payload) {
  std::string out;
  const uint64_t len = payload.size();
  put_fixed(out, &len, 8);
  const uint32_t len_crc = masked_crc32c(&len, 8);
  put_fixed(out, &len_crc, 4);
  out += payload;
  const uint32_t data_crc = masked_crc32c(payload.data(), payload.size());
  put_fixed(out, &data_crc, 4);
  return out;
}

std::string event_file_version(double wall_time) {
  std::string e;
  put_wall_time(e, wall_time);
  put_bytes(e, 3, "brain.Event:2");  // Event.file_version
  return e;
}

std::string event_scalars(double wall_time, int64_t step, const std::vector<std::pair<std::string, float>>& values) {
  std::string summary;
  for (const auto& [tag, v] : values) {
    std::string value;
    put_bytes(value, 1, tag);     // Summary.Value.tag
    put_varint(value, 2 << 3 | 5);  // Summary.Value.simple_value: float
    put_fixed(value, &v, 4);
    put_bytes(summary, 1, value);  // Summary.value (repeated)
  }
  std::string e;
  put_wall_time(e, wall_time);
  put_varint(e, 2 << 3 | 0);  // Event.step: int64
  put_varint(e, uint64_t(step));
  put_bytes(e, 5, summary);  // Event.summary
  return e;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir))
    input_error("logging.tensorboard_dir: cannot create directory '" + dir + "'" + (ec ? ": " + ec.message() : ""));
  char host[256] = "localhost";
  if (gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "localhost");
  host[sizeof(host) - 1] = 0;
  const double t = now_seconds();
  const std::string base = dir + "/events.out.tfevents." + std::to_string(int64_t(t)) + "." + host + "." +
                           std::to_string(int64_t(getpid()));
  std::string path = base;
  for (int i = 1; std::filesystem::exists(path, ec); ++i) path = base + "." + std::to_string(i);  // never overwrite
  out_ = std::make_unique<AuxOutput>(path, "logging.tensorboard_dir");
  out_->append(tfrecord(event_file_version(t)));
}

TensorBoardWriter::~TensorBoardWriter() = default;

bool TensorBoardWriter::add_scalars(int64_t step, const std::vector<std::pair<std::string, float>>& values) {
  return out_->append(tfrecord(event_scalars(now_seconds(), step, values)));
}

}  // namespace tpt
