#include "apps/help.h"

#ifdef TPTRAIN_HAVE_CUDA
#include "core/cuda/cudnn_attention.h"
#endif

namespace tpt {

std::string help_text() {
  return R"(tptrain - Megatron-style GPT training (TP x PP x DP) on CPU ranks and CUDA GPUs

Usage:
  tptrain [train] --config FILE [--set section.key=value]...   train a GPT
  tptrain preprocess --input FILE... --output-prefix PREFIX [--json-key KEY] [--append-eod]
                     [--vocab-file vocab.json --merge-file merges.txt]
                                                               text / JSON lines -> Megatron .bin/.idx
                                                               (byte-level tokenizer: 256 bytes + EOD = 256;
                                                               GPT-2 BPE with Hugging Face's vocabulary files)
  tptrain plan --config FILE [--set section.key=value]... [--world-size N] [--device-memory-gib G]
               [--peak-tflops X] [--intra-node-gbps B] [--inter-node-gbps B]
               [--compute-efficiency F] [--hbm-gbps B] [--json]
                                                               memory per rank, FLOPs, bubble and step time
                                                               of a config (no MPI launch, no GPU needed;
                                                               bandwidths in GB/s; see README "Plan")
  tptrain export --checkpoint DIR --output DIR                  HF GPT-2 model.safetensors + config.json,
                                                               from a checkpoint of any layout
  tptrain generate --checkpoint DIR --prompt TEXT [--max-new-tokens N] [--temperature T] [--top-k K]
                   [--seed S] [--vocab-file vocab.json --merge-file merges.txt]
                                                               text from a checkpoint of any layout (one
                                                               process, KV cache; temperature 0 = greedy)
  tptrain data --config FILE [--set section.key=value]... --samples A:B [--json] [--split train|valid|test]
               [--vocab-file vocab.json --merge-file merges.txt]
                                                               the global samples training reads: blend
                                                               component, its sample, documents spanned,
                                                               start of the text (one process, no MPI)
  tptrain --help | --version

Config: YAML with sections model, parallel, training, optimizer, data, checkpoint, logging
(keys named after Megatron's arguments; see README.md and configs/).

Logged TFLOP/s per device use Megatron's model-FLOPs formula (no recompute):
  72 * B * s * l * h^2 * (1 + s/(12h) + V/(12 l h))  per iteration, B = global batch size.

Exit status: 0 done, 2 bad input (config, data, checkpoint, arguments), 1 internal failure.
)";
}

std::string version_text() {
  std::string s = "tptrain " TPTRAIN_VERSION "\nbackends: cpu (OpenBLAS)";
#ifdef TPTRAIN_HAVE_CUDA  // the CUDA backend and, with it, NCCL
  s += ", cuda (cuBLASLt)";
  const std::string cudnn = cuda::cudnn_attention_version();  // empty: built without cuDNN (TPTRAIN_CUDNN)
  s += "\nattention on GPUs: " +
       (cudnn.empty() ? std::string("own flash kernels (built without cuDNN)")
                      : cudnn + " for bf16/fp16, own flash kernels otherwise");
#ifdef TPTRAIN_HAVE_NCCL
  s += "\ncommunication on GPUs: NCCL";
#endif
#endif
#ifdef TPTRAIN_HAVE_MPI
  s += "\ncommunication: MPI";
#else
  s += "\ncommunication: none (single process)";
#endif
  return s + "\n";
}

}  // namespace tpt
