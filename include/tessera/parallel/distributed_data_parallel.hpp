// Deprecated: include tessera/distributed/distributed_data_parallel.hpp (the distributed code is in distributed/);
// this path goes in the next release.
#pragma once

#include "tessera/distributed/distributed_data_parallel.hpp"
