#include "apps/commands.h"
#include "core/error.h"
namespace tpt {
int preprocess_main(int, char**) { input_error("preprocess: not implemented yet"); }
}  // namespace tpt
