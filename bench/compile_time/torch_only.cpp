// Scale of bench/compile_time.sh: LibTorch's C++ API header alone.
#include <torch/torch.h>
