// Config loading: defaults, derived values, overrides, every error class, output round trip,
// padded vocabulary and the world-size checks of resolve_parallel.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "config_test_util.h"
#include "core/config.h"
#include "core/error.h"

namespace tpt {
namespace {

using namespace config_test;

namespace fs = std::filesystem;

// A scratch directory, removed at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("tptrain_config_test_" + std::to_string(getpid()));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name) << text;
    return (path / name).string();
  }
};

TEST(Config, Defaults) {
  Config c = parse_config(kBase, "test.yaml");
  EXPECT_EQ(c.model.num_layers, 2);
  EXPECT_EQ(c.model.make_vocab_size_divisible_by, 128);
  EXPECT_DOUBLE_EQ(c.model.layernorm_epsilon, 1e-5);
  EXPECT_DOUBLE_EQ(c.model.init_method_std, 0.02);
  EXPECT_EQ(c.model.init_from, "");
  EXPECT_EQ(c.parallel.tensor_model_parallel_size, 1);
  EXPECT_EQ(c.parallel.pipeline_model_parallel_size, 1);
  EXPECT_EQ(c.parallel.data_parallel_size, 0);
  EXPECT_EQ(c.parallel.pipeline_schedule, PipelineSchedule::OneFOneB);
  EXPECT_FALSE(c.parallel.sequence_parallel);
  EXPECT_EQ(c.training.micro_batch_size, 1);
  EXPECT_EQ(c.training.global_batch_size, 0);
  EXPECT_EQ(c.training.precision, Precision::FP32);
  EXPECT_EQ(c.training.recompute, Recompute::None);
  EXPECT_EQ(c.training.seed, 1234u);
  EXPECT_EQ(c.training.device, Device::Auto);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 6.0e-4);
  EXPECT_EQ(c.optimizer.lr_decay_style, LrDecayStyle::Cosine);
  EXPECT_DOUBLE_EQ(c.optimizer.initial_loss_scale, 4294967296.0);
  EXPECT_TRUE(c.data.shuffle);
  EXPECT_EQ(c.data.split, (std::vector<double>{969, 30, 1}));
  EXPECT_EQ(c.checkpoint.exit_signal, "SIGTERM");
  EXPECT_EQ(c.checkpoint.keep_last, 0);
  EXPECT_EQ(c.logging.log_interval, 1);
  EXPECT_EQ(c.data.path.paths, std::vector<std::string>{"/nonexistent/tiny_text_document"});  // not checked here
  EXPECT_FALSE(c.data.path.is_blend());
  EXPECT_FALSE(c.data.eod_mask_loss);
  EXPECT_FALSE(c.data.reset_position_ids);
  EXPECT_EQ(c.data.eod_token_id, c.model.vocab_size - 1);  // both tokenizers' end of document
}

TEST(Config, DerivedValues) {
  Config c = parse_config(kBase, "test.yaml");
  EXPECT_EQ(c.model.ffn_hidden_size, 256);
  EXPECT_EQ(c.model.max_position_embeddings, 32);
  EXPECT_EQ(c.optimizer.lr_decay_iters, 10);

  c = parse_config(std::string(kBase) + "optimizer:\n  lr_decay_iters: 7\n", "test.yaml",
                   {"model.ffn_hidden_size=100", "model.max_position_embeddings=64"});
  EXPECT_EQ(c.model.ffn_hidden_size, 100);
  EXPECT_EQ(c.model.max_position_embeddings, 64);
  EXPECT_EQ(c.optimizer.lr_decay_iters, 7);

  // Derived from the overridden value, not the file's.
  c = parse_config(kBase, "test.yaml", {"model.hidden_size=128"});
  EXPECT_EQ(c.model.ffn_hidden_size, 512);
}

TEST(Config, NullMeansDefault) {
  Config c = parse_config(std::string(kBase) +
                              "checkpoint:\n  save: null\n  keep_last: ~\n  exit_duration_mins:\n"
                              "parallel:\n  data_parallel_size: null\nlogging:\n",
                          "test.yaml", {"model.ffn_hidden_size=null"});
  EXPECT_EQ(c.checkpoint.save, "");
  EXPECT_EQ(c.checkpoint.keep_last, 0);
  EXPECT_EQ(c.parallel.data_parallel_size, 0);
  EXPECT_EQ(c.model.ffn_hidden_size, 256);
}

TEST(Config, Overrides) {
  TempDir dir;
  std::string weights = dir.write("gpt2.safetensors", "x");
  Config c = parse_config(kBase, "test.yaml",
                          {"data.split=[98,1,1]", "training.precision=bf16", "optimizer.lr=1e-3",
                           "parallel.sequence_parallel=true", "checkpoint.save=/tmp/ck",
                           "model.init_from=" + weights, "training.seed=7"});
  EXPECT_EQ(c.data.split, (std::vector<double>{98, 1, 1}));
  EXPECT_EQ(c.training.precision, Precision::BF16);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 1e-3);
  EXPECT_TRUE(c.parallel.sequence_parallel);
  EXPECT_EQ(c.checkpoint.save, "/tmp/ck");
  EXPECT_EQ(c.model.init_from, weights);
  EXPECT_EQ(c.training.seed, 7u);

  // Later overrides win; null clears a value the file gave.
  std::string with_init = std::string(kBase) + "checkpoint:\n  save: /x\n";
  c = parse_config(with_init, "test.yaml", {"checkpoint.save=null", "training.train_iters=5",
                                            "training.train_iters=6"});
  EXPECT_EQ(c.checkpoint.save, "");
  EXPECT_EQ(c.training.train_iters, 6);
  EXPECT_EQ(c.optimizer.lr_decay_iters, 6);

  // Megatron's string form of the split; overrides supply missing required keys.
  c = parse_config("model:\n  num_layers: 2\n  hidden_size: 64\n  num_attention_heads: 4\n"
                   "  seq_length: 32\ntraining:\n  train_iters: 1\n",
                   "test.yaml", {"model.vocab_size=50257", "data.path=x", "data.split=949,50,1"});
  EXPECT_EQ(c.model.vocab_size, 50257);
  EXPECT_EQ(c.data.split, (std::vector<double>{949, 50, 1}));
}

TEST(ConfigErrors, UnknownAndMisspeltNames) {
  std::string m = error_of(std::string(kBase) + "logging:\n  foo_bar: 1\n");
  EXPECT_EQ(m.rfind("test.yaml: logging.foo_bar: unknown key", 0), 0u) << m;

  m = error_of("model:\n  hidden_sise: 64\n");
  EXPECT_EQ(m, "test.yaml: model.hidden_sise: unknown key (did you mean 'model.hidden_size'?)");

  m = error_of(std::string(kBase) + "modle:\n  num_layers: 2\n");
  EXPECT_EQ(m, "test.yaml: modle: unknown section (did you mean 'model'?)");

  m = error_of(std::string(kBase) + "training:\n  lr: 0.1\n");  // duplicate section reported first
  EXPECT_HAS(m, "training");
  m = error_of("training:\n  lr: 0.1\n");
  EXPECT_HAS(m, "training.lr: unknown key (did you mean 'optimizer.lr'?)");

  m = error_of("hidden_size: 64\n");
  EXPECT_HAS(m, "hidden_size: unknown section (did you mean 'model.hidden_size'?)");

  m = error_of("model:\n  zzzzzzzz: 1\n");
  EXPECT_EQ(m, "test.yaml: model.zzzzzzzz: unknown key");  // nothing close: no suggestion

  m = error_of("model:\n  num_layers: 2\n  num_layers: 3\n");
  EXPECT_HAS(m, "model.num_layers: duplicate key");
}

TEST(ConfigErrors, WrongTypes) {
  struct Case {
    const char* set;
    const char* expect;
  } cases[] = {
      {"model.hidden_size=sixty", "model.hidden_size: expected an integer, got 'sixty'"},
      {"model.hidden_size=64.0", "model.hidden_size: expected an integer, got '64.0'"},
      {"model.hidden_size=\"64\"", "model.hidden_size: expected an integer"},
      {"model.hidden_size={a: 1}", "model.hidden_size: expected an integer, got a map"},
      {"model.hidden_size=[64]", "model.hidden_size: expected an integer, got a list"},
      {"model.hidden_size=99999999999", "model.hidden_size: 99999999999 is out of range"},
      {"parallel.sequence_parallel=maybe", "parallel.sequence_parallel: expected a bool (true | false), got 'maybe'"},
      {"parallel.sequence_parallel=1", "parallel.sequence_parallel: expected a bool"},
      {"optimizer.lr=fast", "optimizer.lr: expected a number, got 'fast'"},
      {"optimizer.lr=null", "optimizer.lr: expected a number, got null"},
      {"training.seed=-1", "training.seed: expected a non-negative integer"},
      {"data.path=[a, b]", "data.path: blend item 1 (component 1) must be a weight (a number), got 'a'"},
      {"data.path=[0.5, a, 0.5]", "data.path: the blend has 3 items, an odd number: item 3 ('0.5') has no prefix"},
      {"data.path=[0.5, a, b]", "data.path: the blend has 3 items, an odd number: item 3 ('b') has no weight"},
      {"data.path=[0.5, a, 0, b]", "data.path: blend item 3 (component 2): the weight 0 must be positive"},
      {"data.path=[0.5, a, -1, b]", "data.path: blend item 3 (component 2): the weight -1 must be positive"},
      {"data.path=[0.5, a, 1, 2]", "data.path: blend item 4 (component 2) must be a path (a prefix), got '2'"},
      {"data.path=[]", "data.path: empty blend"},
      {"data.path={a: 1}", "data.path: expected a path or a blend"},
      {"data.eod_token_id=-1", "data.eod_token_id: must be >= 0"},
      {"data.eod_token_id=50257", "data.eod_token_id: 50257 is not below model.vocab_size"},
      {"data.reset_attention_mask=true", "data.reset_attention_mask: is not supported"},
      {"data.split=[1, 2]", "data.split: expected a list of 3 numbers"},
      {"data.split=[1, x, 2]", "data.split: expected a list of 3 numbers"},
      {"data.shuffle=null", "data.shuffle: expected a bool"},
      {"model.num_layers=null", "model.num_layers: required"},
  };
  for (const Case& c : cases) {
    std::string m = error_of_set(c.set);
    EXPECT_EQ(m.rfind(std::string("--set ") + c.set + ": ", 0), 0u) << m;
    EXPECT_HAS(m, c.expect);
  }
  std::string m = error_of(std::string(kBase) + "parallel:\n  tensor_model_parallel_size: 1.5\n");
  EXPECT_EQ(m, "test.yaml: parallel.tensor_model_parallel_size: expected an integer, got '1.5'");
  m = error_of(std::string(kBase) + "parallel: 3\n");
  EXPECT_HAS(m, "test.yaml: parallel: expected a map of keys, got '3'");
}

TEST(ConfigErrors, EnumValues) {
  struct Case {
    const char* set;
    const char* allowed;
  } cases[] = {
      {"parallel.pipeline_schedule=interleaved", "1f1b | gpipe | zb-h1"},
      {"training.precision=fp8", "fp32 | bf16 | fp16"},
      {"training.recompute=partial", "none | selective | full"},
      {"training.device=tpu", "auto | cpu | cuda"},
      {"optimizer.lr_decay_style=exp", "cosine | linear | constant"},
      {"checkpoint.exit_signal=SIGKILL", "SIGTERM | SIGINT | SIGUSR1 | SIGUSR2 | SIGHUP"},
      {"model.normalization=layernorm", "LayerNorm | RMSNorm"},
      {"model.position_embedding_type=alibi", "learned_absolute | rope"},
  };
  for (const Case& c : cases) {
    std::string m = error_of_set(c.set);
    std::string key = std::string(c.set).substr(0, std::string(c.set).find('='));
    EXPECT_HAS(m, key + ": unknown value");
    EXPECT_HAS(m, std::string("(allowed: ") + c.allowed + ")");
  }
  EXPECT_HAS(error_of_set("training.precision=null"), "training.precision: expected one of fp32 | bf16 | fp16");
  EXPECT_HAS(error_of_set("model.normalization=null"), "model.normalization: expected one of LayerNorm | RMSNorm");
}

TEST(ConfigErrors, Constraints) {
  struct Case {
    std::vector<std::string> sets;
    const char* expect;
  } cases[] = {
      {{"model.num_layers=0"}, "model.num_layers: must be >= 1, got 0"},
      {{"model.hidden_size=-64"}, "model.hidden_size: must be >= 1"},
      {{"model.num_attention_heads=0"}, "model.num_attention_heads: must be >= 1"},
      {{"model.seq_length=0"}, "model.seq_length: must be >= 1"},
      {{"model.vocab_size=-1"}, "model.vocab_size: must be >= 1"},
      {{"model.ffn_hidden_size=0"}, "model.ffn_hidden_size: must be >= 1, got 0 (use null"},
      {{"model.make_vocab_size_divisible_by=0"}, "model.make_vocab_size_divisible_by: must be >= 1"},
      {{"parallel.tensor_model_parallel_size=0"}, "parallel.tensor_model_parallel_size: must be >= 1"},
      {{"parallel.pipeline_model_parallel_size=-2"}, "parallel.pipeline_model_parallel_size: must be >= 1"},
      {{"parallel.data_parallel_size=0"}, "parallel.data_parallel_size: must be >= 1"},
      {{"training.micro_batch_size=0"}, "training.micro_batch_size: must be >= 1"},
      {{"training.global_batch_size=0"}, "training.global_batch_size: must be >= 1"},
      {{"training.train_iters=0"}, "training.train_iters: must be >= 1"},
      {{"training.cpu_threads=-1"}, "training.cpu_threads: must be >= 1"},
      {{"logging.log_interval=0"}, "logging.log_interval: must be >= 1"},
      {{"data.eval_interval=0"}, "data.eval_interval: must be >= 1"},
      {{"data.eval_iters=-1"}, "data.eval_iters: must be >= 0"},
      {{"checkpoint.save_interval=0"}, "checkpoint.save_interval: must be >= 1"},
      {{"checkpoint.keep_last=0"}, "checkpoint.keep_last: must be >= 1"},
      {{"checkpoint.exit_duration_mins=-5"}, "checkpoint.exit_duration_mins: must be > 0"},
      {{"optimizer.lr_warmup_iters=-1"}, "optimizer.lr_warmup_iters: must be >= 0"},
      {{"optimizer.lr_decay_iters=0"}, "optimizer.lr_decay_iters: must be >= 1"},
      {{"model.num_attention_heads=5"}, "model.hidden_size: 64 is not divisible by model.num_attention_heads (5)"},
      {{"model.max_position_embeddings=16"}, "model.seq_length: 32 is longer than model.max_position_embeddings (16)"},
      {{"model.seq_length=64", "model.max_position_embeddings=32"}, "model.max_position_embeddings (32)"},
      {{"model.hidden_dropout=1.0"}, "model.hidden_dropout: must be in [0, 1), got 1"},
      {{"model.attention_dropout=-0.1"}, "model.attention_dropout: must be in [0, 1)"},
      {{"model.layernorm_epsilon=0"}, "model.layernorm_epsilon: must be > 0"},
      {{"model.init_method_std=-0.02"}, "model.init_method_std: must be > 0"},
      {{"optimizer.lr=-1"}, "optimizer.lr: must be >= 0"},
      {{"optimizer.min_lr=-1e-5"}, "optimizer.min_lr: must be >= 0"},
      {{"optimizer.lr=1e-4", "optimizer.min_lr=1e-3"}, "optimizer.min_lr: 0.001 is greater than optimizer.lr"},
      {{"optimizer.adam_beta1=1"}, "optimizer.adam_beta1: must be in [0, 1)"},
      {{"optimizer.adam_beta2=1.5"}, "optimizer.adam_beta2: must be in [0, 1)"},
      {{"optimizer.adam_eps=0"}, "optimizer.adam_eps: must be > 0"},
      {{"optimizer.weight_decay=-0.1"}, "optimizer.weight_decay: must be >= 0"},
      {{"optimizer.clip_grad=-1"}, "optimizer.clip_grad: must be >= 0"},
      {{"optimizer.initial_loss_scale=0"}, "optimizer.initial_loss_scale: must be > 0"},
      {{"data.split=[1, -1, 1]"}, "data.split: weights must be finite and non-negative"},
      {{"data.split=[0, 0, 0]"}, "data.split: expected 3 non-negative weights"},
      // bounds of the numbers that size work (issue 29): products of keys below 2^62 tokens
      {{"data.split=[1, -1, 1]"}, "got -1 at entry 2 (valid)"},
      {{"data.split=[1e308, 1e308, 1]"}, "data.split: the weights' sum overflows a double at entry 2 (valid)"},
      {{"data.path=[1e308, a, 1, b, 1e308, c]"},
       "blend item 5 (component 3): the weight 1e308 makes the weights' sum overflow a double"},
      {{"training.train_iters=9223372036854775807"}, "training.train_iters: must be <= 144115188075855872 (2^62 tokens"},
      {{"training.global_batch_size=1024", "training.train_iters=140737488355329"},
       "training.train_iters: must be <= 140737488355328"},  // 2^62 / (1024 x 32)
      {{"data.eval_iters=4611686018427387904"}, "data.eval_iters: must be <= "},
      {{"model.make_vocab_size_divisible_by=16777217"}, "model.make_vocab_size_divisible_by: must be <= 16777216"},
      {{"parallel.ddp_bucket_size=1099511627777"}, "parallel.ddp_bucket_size: must be <= 1099511627776"},
      {{"training.micro_batch_size=4", "training.global_batch_size=10"},
       "training.global_batch_size: 10 is not a multiple of training.micro_batch_size (4)"},
      {{"model.init_from=/nonexistent/gpt2.safetensors"},
       "model.init_from: no such file '/nonexistent/gpt2.safetensors'"},
  };
  for (const Case& c : cases) {
    std::string m = error_of(kBase, c.sets);
    EXPECT_EQ(m.rfind("--set ", 0), 0u) << m;  // blamed on the override that gave the value
    EXPECT_HAS(m, c.expect);
  }
  // A constraint on a value from the file names the file.
  std::string m = error_of(std::string(kBase) + "optimizer:\n  adam_eps: 0\n");
  EXPECT_EQ(m, "test.yaml: optimizer.adam_eps: must be > 0, got 0");
  // Explicit zeros are fine where zero means something.
  Config ok = parse_config(kBase, "test.yaml", {"optimizer.clip_grad=0", "optimizer.lr=0", "data.eval_iters=0",
                                                "model.hidden_dropout=0.1", "data.split=[1,0,0]",
                                                "training.global_batch_size=1024", "training.train_iters=140737488355328"});
  EXPECT_DOUBLE_EQ(ok.optimizer.clip_grad, 0.0);
}

TEST(ConfigErrors, MissingRequiredKeys) {
  const char* required[] = {"model.num_layers", "model.hidden_size", "model.num_attention_heads",
                            "model.seq_length", "model.vocab_size", "training.train_iters", "data.path"};
  for (const char* key : required) {
    std::string leaf = std::string(key).substr(std::string(key).find('.') + 1);
    std::string yaml = kBase;
    size_t at = yaml.find("  " + leaf + ":");
    ASSERT_NE(at, std::string::npos) << key;
    yaml.erase(at, yaml.find('\n', at) - at + 1);
    EXPECT_EQ(error_of(yaml), std::string("test.yaml: ") + key + ": missing required key");
  }
}

TEST(ConfigErrors, Documents) {
  EXPECT_HAS(error_of(""), "test.yaml: the config is empty");
  EXPECT_HAS(error_of("# only a comment\n"), "test.yaml: the config is empty");
  EXPECT_HAS(error_of("- model\n- data\n"), "test.yaml: the top level must be a map of sections");
  EXPECT_HAS(error_of("just a string\n"), "test.yaml: the top level must be a map");
  std::string m = error_of("model:\n  num_layers: [1, 2\n  hidden_size: 64\n");
  EXPECT_EQ(m.rfind("test.yaml:", 0), 0u) << m;
  EXPECT_HAS(m, "YAML syntax error");
  EXPECT_HAS(error_of("model:\n  num_layers: 2\n\thidden_size: 64\n"), "test.yaml:3:");
}

TEST(ConfigErrors, MalformedOverrides) {
  EXPECT_EQ(error_of_set("model.hidden_size"), "--set model.hidden_size: expected section.key=value (no '=')");
  EXPECT_EQ(error_of_set("hidden_size=64"),
            "--set hidden_size=64: expected section.key=value (did you mean 'model.hidden_size'?)");
  EXPECT_EQ(error_of_set("model.hiden_size=64"),
            "--set model.hiden_size=64: model.hiden_size: unknown key (did you mean 'model.hidden_size'?)");
  EXPECT_EQ(error_of_set("modle.hidden_size=64"),
            "--set modle.hidden_size=64: modle: unknown section (did you mean 'model.hidden_size'?)");
  EXPECT_HAS(error_of_set("data.split=[1, 2"), "--set data.split=[1, 2:");
  EXPECT_HAS(error_of_set("data.split=[1, 2"), "YAML syntax error");
  EXPECT_HAS(error_of_set(".x=1"), "expected section.key=value");
}

TEST(ConfigFiles, LoadConfig) {
  TempDir dir;
  std::string good = dir.write("good.yaml", kBase);
  Config c = load_config(good, {"training.train_iters=3"});
  EXPECT_EQ(c.training.train_iters, 3);

  auto load_error = [](const std::string& path) -> std::string {
    try {
      load_config(path);
    } catch (const InputError& e) {
      return e.what();
    }
    ADD_FAILURE() << "no error for " << path;
    return "";
  };
  std::string missing = (dir.path / "nope.yaml").string();
  EXPECT_EQ(load_error(missing).rfind(missing + ": cannot read config file", 0), 0u) << load_error(missing);
  std::string empty = dir.write("empty.yaml", "");
  EXPECT_EQ(load_error(empty), empty + ": the config is empty (expected sections: model, parallel, "
                                       "training, optimizer, data, checkpoint, logging)");
  EXPECT_HAS(load_error(dir.path.string()), "is a directory");
  std::string bad = dir.write("bad.yaml", "model: [\n");
  EXPECT_EQ(load_error(bad).rfind(bad + ":", 0), 0u);
  std::string typo = dir.write("typo.yaml", "model:\n  hidden_sise: 1\n");
  EXPECT_EQ(load_error(typo), typo + ": model.hidden_sise: unknown key (did you mean 'model.hidden_size'?)");
}

// A config with a non-default value in most keys, including strings that need quoting in YAML.
Config unusual_config(const std::string& weights) {
  return parse_config(kBase, "test.yaml",
                      {"model.init_from=" + weights, "model.layernorm_epsilon=1e-6",
                       "model.hidden_dropout=0.1", "model.init_method_std=0.006",
                       "parallel.tensor_model_parallel_size=2", "parallel.pipeline_model_parallel_size=2",
                       "parallel.pipeline_schedule=gpipe", "parallel.sequence_parallel=true",
                       "training.micro_batch_size=2", "training.global_batch_size=8",
                       "training.precision=fp16", "training.recompute=selective",
                       "training.seed=18446744073709551615", "training.device=cpu",
                       "training.cpu_threads=3", "optimizer.lr=3.0e-4", "optimizer.min_lr=1e-5",
                       "optimizer.lr_warmup_iters=2", "optimizer.lr_decay_style=linear",
                       "optimizer.initial_loss_scale=65536", "data.path='data/my corpus: v2 #1'",
                       "data.shuffle=false", "data.split=[0.5, 0.25, 0.125]", "data.valid_path='null'",
                       "checkpoint.save=/tmp/ck pt", "checkpoint.load=\"yes\"", "checkpoint.keep_last=3",
                       "checkpoint.exit_signal=SIGUSR1", "checkpoint.exit_duration_mins=90.5",
                       "logging.metrics_file=\"123\"", "logging.trace_file='-x\\\"y'",
                       "logging.tensorboard_dir='/tmp/tb dir: 1'", "logging.log_timers_to_tensorboard=true"});
}

TEST(ConfigOutput, RoundTrip) {
  TempDir dir;
  std::string weights = dir.write("w.safetensors", "x");
  const Config blend = parse_config(kBase, "test.yaml",
                                    {"data.path=[0.3, 'a b', 1e-3, \"0.5\", 2, c]", "data.valid_path=[1, v]",
                                     "data.eod_mask_loss=true", "data.reset_position_ids=true", "data.eod_token_id=0"});
  EXPECT_EQ(blend.data.path.paths, (std::vector<std::string>{"a b", "0.5", "c"}));
  EXPECT_EQ(blend.data.path.weights, (std::vector<double>{0.3, 1e-3, 2}));
  EXPECT_EQ(blend.data.valid_path.paths, std::vector<std::string>{"v"});
  EXPECT_EQ(blend.data.eod_token_id, 0);
  for (const Config& c : {parse_config(kBase, "test.yaml"), unusual_config(weights), blend, llama_config(),
                          llama_config({"model.rope_scaling={factor: 0.1, low_freq_factor: 1.0e-7, "
                                        "high_freq_factor: 1e300, original_max_position_embeddings: 1}",
                                        "model.rotary_percent=0.25", "model.rotary_interleaved=true",
                                        "model.kv_channels=24", "model.add_qkv_bias=true"})}) {
    std::string yaml = config_to_yaml(c);
    Config back = parse_config(yaml, "resolved.yaml");
    EXPECT_EQ(config_to_json(back), config_to_json(c)) << yaml;
    EXPECT_EQ(config_to_yaml(back), yaml);
    Config resolved = c;
    resolve_parallel(resolved, 4 * resolved.parallel.tensor_model_parallel_size *
                                   resolved.parallel.pipeline_model_parallel_size);
    Config resolved_back = parse_config(config_to_yaml(resolved), "resolved.yaml");
    EXPECT_EQ(config_to_json(resolved_back), config_to_json(resolved));
  }
  Config c = unusual_config(weights);
  EXPECT_EQ(c.data.path.paths, std::vector<std::string>{"data/my corpus: v2 #1"});
  EXPECT_EQ(c.data.valid_path.paths, std::vector<std::string>{"null"});
  EXPECT_EQ(c.checkpoint.load, "yes");
  EXPECT_EQ(c.logging.trace_file, "-x\\\"y");
}

TEST(ConfigOutput, YamlLayout) {
  std::string y = config_to_yaml(parse_config(kBase, "test.yaml"));
  std::vector<size_t> at;
  for (const char* sec : {"model:\n", "parallel:\n", "training:\n", "optimizer:\n", "data:\n",
                          "checkpoint:\n", "logging:\n"}) {
    at.push_back(y.find(std::string("\n") + sec) + 1);
  }
  EXPECT_EQ(y.rfind("model:\n  num_layers: 2\n", 0), 0u) << y;
  for (size_t i = 1; i < at.size(); ++i) EXPECT_GT(at[i], at[i - 1]) << y;
  EXPECT_HAS(y, "  init_from: null\n");
  EXPECT_HAS(y, "  ffn_hidden_size: 256\n");
  EXPECT_HAS(y, "  data_parallel_size: null\n");
  EXPECT_HAS(y, "  global_batch_size: null\n");
  EXPECT_HAS(y, "  layernorm_epsilon: 1.0e-05\n");
  EXPECT_HAS(y, "  split: [969, 30, 1]\n");
  EXPECT_HAS(y, "  initial_loss_scale: 4294967296\n");
  EXPECT_HAS(y, "  pipeline_schedule: 1f1b\n");
  EXPECT_HAS(y, "  keep_last: null\n");
  EXPECT_HAS(y, "  exit_duration_mins: null\n");
}

TEST(ConfigOutput, Json) {
  Config c = parse_config(kBase, "test.yaml", {"checkpoint.save=/ck"});
  nlohmann::json j = config_to_json(c);
  EXPECT_EQ(j.size(), 7u);
  EXPECT_EQ(j["model"]["hidden_size"], 64);
  EXPECT_EQ(j["model"]["ffn_hidden_size"], 256);
  EXPECT_TRUE(j["model"]["init_from"].is_null());
  EXPECT_TRUE(j["parallel"]["data_parallel_size"].is_null());
  EXPECT_TRUE(j["training"]["global_batch_size"].is_null());
  EXPECT_EQ(j["training"]["precision"], "fp32");
  EXPECT_EQ(j["training"]["seed"], 1234u);
  EXPECT_EQ(j["data"]["split"], nlohmann::json({969.0, 30.0, 1.0}));
  EXPECT_EQ(j["data"]["shuffle"], true);
  EXPECT_EQ(j["checkpoint"]["save"], "/ck");
  EXPECT_TRUE(j["checkpoint"]["keep_last"].is_null());
  EXPECT_DOUBLE_EQ(j["optimizer"]["adam_eps"].get<double>(), 1e-8);
  resolve_parallel(c, 3);
  j = config_to_json(c);
  EXPECT_EQ(j["parallel"]["data_parallel_size"], 3);
  EXPECT_EQ(j["training"]["global_batch_size"], 3);
}

TEST(Config, PaddedVocabSize) {
  EXPECT_EQ(padded_vocab_size(50257, 128, 1), 50304);  // 393 * 128
  EXPECT_EQ(padded_vocab_size(50257, 128, 2), 50432);  // 197 * 256
  EXPECT_EQ(padded_vocab_size(50257, 128, 4), 50688);  // 99 * 512
  EXPECT_EQ(padded_vocab_size(50257, 128, 8), 51200);  // 50 * 1024
  EXPECT_EQ(padded_vocab_size(100, 128, 1), 128);
  EXPECT_EQ(padded_vocab_size(128, 128, 1), 128);
  EXPECT_EQ(padded_vocab_size(129, 1, 1), 129);
  EXPECT_EQ(padded_vocab_size(1, 8, 3), 24);
  EXPECT_EQ(padded_vocab_size(48, 8, 3), 48);
  EXPECT_EQ(padded_vocab_size(49, 8, 3), 72);
}

TEST(Config, ResolveParallel) {
  Config c = parse_config(kBase, "test.yaml",
                          {"parallel.tensor_model_parallel_size=2", "parallel.pipeline_model_parallel_size=2",
                           "training.micro_batch_size=3"});
  Config r = c;
  resolve_parallel(r, 8);
  EXPECT_EQ(r.parallel.data_parallel_size, 2);
  EXPECT_EQ(r.training.global_batch_size, 6);
  resolve_parallel(r, 8);  // idempotent: the resolved values are consistent
  EXPECT_EQ(r.training.global_batch_size, 6);

  r = c;
  r.parallel.data_parallel_size = 2;
  r.training.global_batch_size = 24;
  resolve_parallel(r, 8);
  EXPECT_EQ(r.training.global_batch_size, 24);

  std::string m = resolve_error(c, 6);
  EXPECT_HAS(m, "parallel.tensor_model_parallel_size");
  EXPECT_HAS(m, "parallel.pipeline_model_parallel_size");
  EXPECT_HAS(m, "world size 6");

  r = c;
  r.parallel.data_parallel_size = 3;
  m = resolve_error(r, 8);
  EXPECT_HAS(m, "parallel.data_parallel_size: 3 does not match world size 8");

  r = c;
  r.training.global_batch_size = 9;  // a multiple of micro_batch_size 3, not of 3 * DP 2
  m = resolve_error(r, 8);
  EXPECT_HAS(m, "training.global_batch_size (9)");
  EXPECT_HAS(m, "training.micro_batch_size (3)");
  EXPECT_HAS(m, "data-parallel size (2)");

  r = c;
  r.parallel.tensor_model_parallel_size = 8;
  r.parallel.pipeline_model_parallel_size = 1;
  EXPECT_HAS(resolve_error(r, 8), "model.num_attention_heads (4) is not divisible by parallel.tensor_model_parallel_size (8)");

  r = c;
  r.model.ffn_hidden_size = 255;
  EXPECT_HAS(resolve_error(r, 4), "model.ffn_hidden_size (255) is not divisible by parallel.tensor_model_parallel_size (2)");

  r = c;
  r.parallel.tensor_model_parallel_size = 1;
  r.parallel.pipeline_model_parallel_size = 4;
  r.model.num_layers = 6;
  EXPECT_HAS(resolve_error(r, 4), "model.num_layers (6) is not divisible by parallel.pipeline_model_parallel_size (4)");

  r = c;
  r.parallel.sequence_parallel = true;
  r.model.seq_length = 31;
  r.model.max_position_embeddings = 32;
  EXPECT_HAS(resolve_error(r, 4), "model.seq_length (31) is not divisible by parallel.tensor_model_parallel_size (2)");

  r = c;  // sequence parallelism splits tokens over the TP ranks: with TP 1 it is refused
  r.parallel.sequence_parallel = true;
  r.parallel.tensor_model_parallel_size = 1;
  m = resolve_error(r, 4);
  EXPECT_HAS(m, "parallel.sequence_parallel: needs parallel.tensor_model_parallel_size > 1");
  r.parallel.tensor_model_parallel_size = 2;
  resolve_parallel(r, 4);  // and accepted with TP 2
  EXPECT_TRUE(r.parallel.sequence_parallel);

  r = parse_config(kBase, "test.yaml");
  resolve_parallel(r, 1);
  EXPECT_EQ(r.parallel.data_parallel_size, 1);
  EXPECT_EQ(r.training.global_batch_size, 1);
}

// The CLI test's base fixture must itself be valid, so each bad fixture fails for its own reason.
TEST(ConfigFiles, CliFixtureBaseIsValid) {
  fs::path base = fs::path(__FILE__).parent_path().parent_path() / "cli" / "bad_configs" / "base_valid.yaml";
  if (!fs::exists(base)) GTEST_SKIP() << base << " not found";
  Config c = load_config(base.string());
  resolve_parallel(c, 1);
  EXPECT_EQ(c.model.num_layers, 2);
}

}  // namespace
}  // namespace tpt
