#include "apps/help.h"

#ifdef TPTRAIN_HAVE_CUDA
#include "core/cuda/attention/cudnn_attention.h"
#endif

namespace tpt {

std::string help_footer() {
  return R"(No command: train (tptrain --config FILE ... = tptrain train --config FILE ...).
tptrain COMMAND --help lists the options of a command.

Config: YAML with sections model, parallel, training, optimizer, data, checkpoint, logging
(keys named after Megatron's arguments; see README.md and configs/); --config - reads it
from standard input (under mpirun rank 0 reads it and sends it to every rank).

Logged TFLOP/s per device use Megatron's model-FLOPs formula (no recompute):
  72 * B * s * l * h^2 * (1 + s/(12h) + V/(12 l h))  per iteration, B = global batch size.

Exit status: 0 done, 2 bad input (config, data, checkpoint, arguments), 1 internal failure.)";
}

std::string version_text() {
  std::string s = "tptrain " TPTRAIN_VERSION "\nbackends: cpu (OpenBLAS)";
#ifdef TPTRAIN_HAVE_CUDA  // the CUDA backend and, with it, NCCL
  s += ", cuda (cuBLASLt)";
  const std::string cudnn = cuda::cudnn_attention_version();  // empty: built without cuDNN (TPTRAIN_CUDNN)
  s += "\nattention on GPUs: " +
       (cudnn.empty()                      ? std::string("own flash kernels (built without cuDNN)")
        : cuda::cudnn_attention_loaded() ? cudnn + " for bf16/fp16, own flash kernels otherwise"
                                           : "own flash kernels (" + cudnn + ")");
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
