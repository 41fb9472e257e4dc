// Deprecated: include tessera/distributed/process_group.hpp (the distributed code is in distributed/);
// this path goes in the next release.
#pragma once

#include "tessera/distributed/process_group.hpp"
