// Deprecated: include tessera/backend/cpu/thread_pool.hpp; this path goes in the next release.
#pragma once

#include "tessera/backend/cpu/thread_pool.hpp"
