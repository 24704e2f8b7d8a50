// train/tensorboard.h: CRC-32C against published vectors, and the protobuf / TFRecord bytes of one
// event derived by hand (wire format: Event{1: wall_time fixed64, 2: step varint, 3: file_version,
// 5: summary{1: value{1: tag, 2: simple_value fixed32}}}; TFRecord: u64 length, masked crc, data,
// masked crc; the CRCs from a bitwise, table-free CRC-32C).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "core/config.h"
#include "core/error.h"
#include "train/tensorboard.h"

namespace tpt {
namespace {

std::string hex(const std::string& s) {
  std::string out;
  char b[3];
  for (unsigned char c : s) std::snprintf(b, sizeof(b), "%02x", c), out += b;
  return out;
}

TEST(TensorBoard, Crc32cKnownVectors) {
  const std::string digits = "123456789";
  EXPECT_EQ(crc32c(digits.data(), digits.size()), 0xE3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
  const std::string zeros(32, '\0'), ones(32, '\xff');  // RFC 3720 B.4
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), ones.size()), 0x62A8AB43u);
  // continuing equals one pass
  EXPECT_EQ(crc32c(digits.data() + 4, 5, crc32c(digits.data(), 4)), 0xE3069283u);
  const uint32_t c = 0xE3069283u;
  EXPECT_EQ(masked_crc32c(digits.data(), digits.size()), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

TEST(TensorBoard, ScalarEventBytesByHand) {
  // wall_time 1.5 (0x3ff8000000000000), step 3, value {tag "a", simple_value 2.0f (0x40000000)}
  const std::string ev = event_scalars(1.5, 3, {{"a", 2.0f}});
  EXPECT_EQ(hex(ev),
            "09" "000000000000f83f"  // 1:fixed64
            "10" "03"                // 2:varint
            "2a" "0a"                // 5:bytes, 10 long: the Summary
            "0a" "08"                // Summary 1:bytes, 8 long: the Value
            "0a" "01" "61"           // Value 1: "a"
            "15" "00000040");        // Value 2:fixed32
  EXPECT_EQ(hex(tfrecord(ev)), "1700000000000000" "e7cef81e" + hex(ev) + "e81c3a9d");
  EXPECT_EQ(hex(event_file_version(0.0)), "09" "0000000000000000" "1a" "0d" + hex("brain.Event:2"));
  // a step past 127 takes a two-byte varint; a large step ten bytes at most
  EXPECT_EQ(hex(event_scalars(0.0, 300, {})).substr(18, 6), "10ac02");
}

TEST(TensorBoard, WriterFileIsRecords) {
  const std::string dir = ::testing::TempDir() + "tpt_tb_unit_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  std::string p1, p2;
  {
    TensorBoardWriter w(dir);
    w.add_scalars(1, {{"lm loss", 3.25f}});
    p1 = w.path();
    TensorBoardWriter w2(dir);  // same second, same process: a second file, not the first overwritten
    p2 = w2.path();
  }
  EXPECT_NE(p1, p2);
  EXPECT_NE(std::filesystem::path(p1).filename().string().find("events.out.tfevents."), std::string::npos);
  std::ifstream in(p1, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string bytes = ss.str();
  // two records back to back: file_version, then the scalar
  const std::string first = tfrecord(event_file_version(0)).substr(0, 12);  // length + its crc do not depend on the time
  EXPECT_EQ(hex(bytes.substr(0, 12)), hex(first));
  const size_t second = 12 + event_file_version(0).size() + 4;
  ASSERT_GT(bytes.size(), second);
  EXPECT_EQ(bytes.size(), second + tfrecord(event_scalars(0, 1, {{"lm loss", 3.25f}})).size());
  std::filesystem::remove_all(dir);
}

TEST(TensorBoard, ConfigKeys) {
  const std::string base = "model: {num_layers: 2, hidden_size: 64, num_attention_heads: 4, seq_length: 32, vocab_size: 100}\n"
                           "training: {train_iters: 10}\ndata: {path: /nonexistent/x}\n";
  Config c = parse_config(base, "t.yaml");
  EXPECT_TRUE(c.logging.tensorboard_dir.empty());  // null: off
  EXPECT_FALSE(c.logging.log_timers_to_tensorboard);
  c = parse_config(base + "logging: {tensorboard_dir: runs/a, log_timers_to_tensorboard: true}\n", "t.yaml");
  EXPECT_EQ(c.logging.tensorboard_dir, "runs/a");
  EXPECT_TRUE(c.logging.log_timers_to_tensorboard);
  EXPECT_NE(config_to_yaml(c).find("tensorboard_dir: runs/a"), std::string::npos);
  EXPECT_THROW(parse_config(base + "logging: {log_timers_to_tensorboard: 3}\n", "t.yaml"), InputError);
  EXPECT_THROW(parse_config(base + "logging: {tensorboard: x}\n", "t.yaml"), InputError);  // unknown key
}

}  // namespace
}  // namespace tpt
