// Optimisers in one include (DESIGN §3.6): SGD, Adam, AdamW over nn::ParameterRef lists.
#pragma once

#include "tessera/optim/adam.hpp"
#include "tessera/optim/optimizer.hpp"
#include "tessera/optim/sgd.hpp"
