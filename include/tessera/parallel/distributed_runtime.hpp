// Deprecated: include tessera/distributed/runtime.hpp (the distributed code is in distributed/);
// this path goes in the next release.
#pragma once

#include "tessera/distributed/runtime.hpp"
