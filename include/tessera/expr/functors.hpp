// The elementwise functors the expression nodes apply (ts::ops::add, exp, relu ...): defined in
// backend/functors.hpp, below the backend that also calls them; this header is where expr/
// and users find them.
#pragma once

#include "tessera/backend/functors.hpp"
