// Baseline of bench/compile_time.sh: the umbrella header alone.
#include <tessera/tessera.hpp>
