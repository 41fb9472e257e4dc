// Deprecated: include tessera/nn/batch_norm.hpp; this path goes in the next release.
#pragma once

#include "tessera/nn/batch_norm.hpp"
