// Modules, layers, losses and initialisers in one include (DESIGN §3.6): Module, Parameter,
// Buffer, Linear, Conv2d, ReLU/Sigmoid/Tanh, Sequential, Dropout, BatchNorm1d/2d, MaxPool2d,
// AvgPool2d, AdaptiveAvgPool2d, Flatten, mse_loss, cross_entropy, ts::nn::functional (with
// one_hot), ts::nn::init.
#pragma once

#include "tessera/nn/activation.hpp"
#include "tessera/nn/batch_norm.hpp"
#include "tessera/nn/buffer.hpp"
#include "tessera/nn/conv.hpp"
#include "tessera/nn/dropout.hpp"
#include "tessera/nn/flatten.hpp"
#include "tessera/nn/functional.hpp"
#include "tessera/nn/init.hpp"
#include "tessera/nn/linear.hpp"
#include "tessera/nn/loss.hpp"
#include "tessera/nn/module.hpp"
#include "tessera/nn/parameter.hpp"
#include "tessera/nn/sequential.hpp"
