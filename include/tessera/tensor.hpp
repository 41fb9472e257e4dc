// The tensor layer in one include: Tensor, factories, cat, printing, AnyTensor and StateDict.
#pragma once

#include "tessera/tensor/any_tensor.hpp"
#include "tessera/tensor/cat.hpp"
#include "tessera/tensor/factories.hpp"
#include "tessera/tensor/print.hpp"
#include "tessera/tensor/state_dict.hpp"
#include "tessera/tensor/tensor.hpp"
