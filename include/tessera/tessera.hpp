// Everything Tessera offers, in one include. Users write `namespace ts = tessera;`.
#pragma once

#include "tessera/autograd.hpp"
#include "tessera/core/config.hpp"
#include "tessera/core/device.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/profiler.hpp"
#include "tessera/core/random.hpp"
#include "tessera/core/shape.hpp"
#include "tessera/core/stream.hpp"
#include "tessera/expr.hpp"
#include "tessera/io/safetensors.hpp"
#include "tessera/memory/mem_pool.hpp"
#include "tessera/memory/memory.hpp"
#include "tessera/nn.hpp"
#include "tessera/optim.hpp"
#include "tessera/tensor.hpp"
// Not here: tessera/data.hpp (its workers bring <thread>) and tessera/tools.hpp (GPU tools;
// 0.2 s of every header-only unit); include them where they are used.

// Compiled mode (core/config.hpp): the class templates every program instantiates for the same
// arguments are compiled once, in tessera::compiled, and only declared to its users' units. Here,
// after every header, so that each member's definition is visible to the library's explicit
// instantiation.
TESSERA_INSTANTIATE(class tessera::memory::pool_resource<
                    tessera::memory::limit_resource_adaptor<tessera::memory::host_memory_resource>,
                    tessera::memory::pytorch_size_policy, tessera::memory::host_stream_policy>)
TESSERA_INSTANTIATE(struct tessera::detail::safetensors::codec<0>)
// The fixed-type templates a float training program uses on device kind K whatever its model:
// Linear, the GEMM paths, the autograd nodes of matmul, softmax and views, the fused nodes the
// library's layers record (a bias added to a product, an activation of a value, dropout's mask
// applied to a value or its ReLU), the copies and fills they use, sums and means of a tensor (a
// bias's gradient, a mean loss), traced cross_entropy and nll_loss (one node), their targets'
// check and the kernels of their options, and the convolutional layers' modules and nodes
// (Conv2d, the poolings, BatchNorm1d/2d, the residual add + ReLU, Dropout's mask).
// With CUDA, tessera::compiled is compiled by nvcc and holds these kernels; a unit that uses only
// them needs no kernel of its own, and may be compiled by g++.
#define TESSERA_UNARY_OF_VAR(op, K) \
  tessera::unary_expr<tessera::ops::op, tessera::autograd::Var<float, K>>
#define TESSERA_BINARY_OF_VARS(op, K)                                      \
  tessera::binary_expr<tessera::ops::op, tessera::autograd::Var<float, K>, \
                       tessera::autograd::Var<float, K>>
#define TESSERA_INSTANTIATE_KIND(K)                                                               \
  TESSERA_INSTANTIATE(class tessera::Tensor<float, K>)                                            \
  TESSERA_INSTANTIATE(class tessera::Tensor<double, K>)                                           \
  TESSERA_INSTANTIATE(class tessera::Tensor<std::int64_t, K>)                                     \
  TESSERA_INSTANTIATE(class tessera::nn::Linear<float, K>)                                        \
  TESSERA_INSTANTIATE(void tessera::detail::matmul_into<float, K>(                                \
      tessera::Tensor<float, K>&, const tessera::Tensor<float, K>&,                               \
      const tessera::Tensor<float, K>&, bool))                                                    \
  TESSERA_INSTANTIATE(void tessera::detail::matmul_add_into<float, K>(                            \
      tessera::Tensor<float, K>, const tessera::Tensor<float, K>&,                                \
      const tessera::Tensor<float, K>&, bool, const tessera::Tensor<float, K>&))                  \
  TESSERA_INSTANTIATE(class tessera::autograd::detail::matmul_node<float, K>)                     \
  TESSERA_INSTANTIATE(class tessera::autograd::detail::softmax_node<float, K, true>)              \
  TESSERA_INSTANTIATE(class tessera::autograd::detail::softmax_node<float, K, false>)             \
  TESSERA_INSTANTIATE(class tessera::autograd::detail::view_node<float, K>)                       \
  TESSERA_INSTANTIATE(class tessera::autograd::detail::view_node<std::int64_t, K>)                \
  TESSERA_INSTANTIATE(                                                                            \
      class tessera::autograd::detail::fused_node<float, K, TESSERA_BINARY_OF_VARS(add, K)>)      \
  TESSERA_INSTANTIATE(                                                                            \
      class tessera::autograd::detail::fused_node<float, K, TESSERA_UNARY_OF_VAR(relu, K)>)       \
  TESSERA_INSTANTIATE(                                                                            \
      class tessera::autograd::detail::fused_node<float, K, TESSERA_UNARY_OF_VAR(sigmoid, K)>)    \
  TESSERA_INSTANTIATE(                                                                            \
      class tessera::autograd::detail::fused_node<float, K, TESSERA_UNARY_OF_VAR(tanh, K)>)       \
  TESSERA_INSTANTIATE(                                                                            \
      class tessera::autograd::detail::fused_node<float, K, TESSERA_BINARY_OF_VARS(multiply, K)>) \
  TESSERA_INSTANTIATE(class tessera::autograd::detail::fused_node<                                \
                      float, K,                                                                   \
                      tessera::binary_expr<tessera::ops::multiply, TESSERA_UNARY_OF_VAR(relu, K), \
                                           tessera::autograd::Var<float, K>>>)                    \
  TESSERA_INSTANTIATE(                                                                            \
      class tessera::nn::detail::dropout_mask_node<float, K, tessera::nn::Dropout>)               \
  TESSERA_INSTANTIATE(class tessera::nn::Conv2d<float, K>)                                        \
  TESSERA_INSTANTIATE(class tessera::nn::detail::conv2d_node<float, K>)                           \
  TESSERA_INSTANTIATE(class tessera::nn::detail::max_pool2d_node<float, K>)                       \
  TESSERA_INSTANTIATE(class tessera::nn::detail::avg_pool2d_node<float, K>)                       \
  TESSERA_INSTANTIATE(class tessera::nn::detail::adaptive_avg_pool2d_node<float, K>)              \
  TESSERA_INSTANTIATE(class tessera::nn::detail::add_relu_node<float, K>)                         \
  TESSERA_INSTANTIATE(class tessera::nn::BatchNorm1d<float, K>)                                   \
  TESSERA_INSTANTIATE(class tessera::nn::BatchNorm2d<float, K>)                                   \
  TESSERA_INSTANTIATE(class tessera::nn::detail::batch_norm<float, K, false>)                     \
  TESSERA_INSTANTIATE(class tessera::nn::detail::batch_norm<float, K, true>)                      \
  TESSERA_INSTANTIATE(class tessera::nn::detail::batch_norm_stats_node<                           \
                      float, K, tessera::nn::detail::batch_norm<float, K, false>>)                \
  TESSERA_INSTANTIATE(class tessera::nn::detail::batch_norm_stats_node<                           \
                      float, K, tessera::nn::detail::batch_norm<float, K, true>>)                 \
  TESSERA_INSTANTIATE(class tessera::nn::detail::batch_norm_apply_node<                           \
                      float, K, tessera::nn::detail::batch_norm<float, K, false>>)                \
  TESSERA_INSTANTIATE(class tessera::nn::detail::batch_norm_apply_node<                           \
                      float, K, tessera::nn::detail::batch_norm<float, K, true>>)                 \
  TESSERA_INSTANTIATE(int tessera::autograd::detail::graph::add_parameter<float, K>(              \
      const std::shared_ptr<tessera::autograd::parameter_slot<float, K>>&))                       \
  TESSERA_INSTANTIATE(tessera::Tensor<std::int64_t, K> tessera::arange<std::int64_t, K>(          \
      double, double, double, int))                                                               \
  TESSERA_INSTANTIATE(                                                                            \
      void tessera::Tensor<float, K>::copy_from<float, K>(const tessera::Tensor<float, K>&))      \
  TESSERA_INSTANTIATE(void tessera::Tensor<std::int64_t, K>::copy_from<std::int64_t, K>(          \
      const tessera::Tensor<std::int64_t, K>&))                                                   \
  TESSERA_INSTANTIATE(void tessera::detail::add_into<float, K, tessera::Tensor<float, K>>(        \
      const tessera::Tensor<float, K>&, const tessera::Tensor<float, K>&))                        \
  TESSERA_INSTANTIATE(tessera::Tensor<float, K> tessera::AnyTensor::as<float, K>() const)         \
  TESSERA_INSTANTIATE(                                                                            \
      tessera::Tensor<float, K> tessera::autograd::detail::value_table::get<float, K>(            \
          int, const tessera::Shape&, bool) const)                                                \
  TESSERA_INSTANTIATE(                                                                            \
      tessera::Tensor<float, K> tessera::autograd::detail::value_table::scratch_tensor<float, K>( \
          const tessera::Shape&))                                                                 \
  TESSERA_INSTANTIATE(                                                                            \
      void tessera::detail::reduce_all_into<tessera::backend::sum_op<float>,                      \
                                            tessera::backend::finish_value, float,                \
                                            tessera::detail::tensor_leaf<float, K>>(              \
          const tessera::Tensor<float, K>&, const tessera::detail::tensor_leaf<float, K>&,        \
          const char*))                                                                           \
  TESSERA_INSTANTIATE(                                                                            \
      void tessera::detail::reduce_all_into<tessera::backend::sum_op<float>,                      \
                                            tessera::backend::finish_mean, float,                 \
                                            tessera::detail::tensor_leaf<float, K>>(              \
          const tessera::Tensor<float, K>&, const tessera::detail::tensor_leaf<float, K>&,        \
          const char*))                                                                           \
  TESSERA_INSTANTIATE(                                                                            \
      void tessera::detail::reduce_dim_into<tessera::backend::sum_op<float>,                      \
                                            tessera::backend::finish_value, float,                \
                                            tessera::detail::tensor_leaf<float, K>>(              \
          const tessera::Tensor<float, K>&, const tessera::detail::tensor_leaf<float, K>&, int,   \
          const char*))                                                                           \
  TESSERA_INSTANTIATE(                                                                            \
      void tessera::detail::reduce_dim_into<tessera::backend::sum_op<float>,                      \
                                            tessera::backend::finish_mean, float,                 \
                                            tessera::detail::tensor_leaf<float, K>>(              \
          const tessera::Tensor<float, K>&, const tessera::detail::tensor_leaf<float, K>&, int,   \
          const char*))                                                                           \
  TESSERA_INSTANTIATE(class tessera::nn::detail::cross_entropy_node<float, K>)                    \
  TESSERA_INSTANTIATE(bool tessera::nn::detail::check_targets<K>(                                 \
      const tessera::Tensor<std::int64_t, K>&, std::int64_t, std::int64_t, const char*))          \
  TESSERA_INSTANTIATE(void tessera::nn::detail::class_loss_forward<float, K>(                     \
      const tessera::Tensor<float, K>&, const tessera::Tensor<float, K>&,                         \
      const tessera::Tensor<std::int64_t, K>&, const tessera::Tensor<std::int64_t, K>&,           \
      const tessera::Tensor<float, K>&, const tessera::nn::detail::class_loss_options&,           \
      const tessera::nn::detail::class_loss_buffers<float, K>&))                                  \
  TESSERA_INSTANTIATE(void tessera::nn::detail::class_loss_backward<float, K>(                    \
      const tessera::Tensor<float, K>&, bool, const tessera::Tensor<float, K>&,                   \
      const tessera::Tensor<float, K>&, const tessera::Tensor<std::int64_t, K>&,                  \
      const tessera::Tensor<std::int64_t, K>&, const tessera::Tensor<float, K>&,                  \
      const tessera::nn::detail::class_loss_options&,                                             \
      const tessera::nn::detail::class_loss_buffers<float, K>&))

TESSERA_INSTANTIATE_KIND(tessera::cpu)
#if TESSERA_CUDA
TESSERA_INSTANTIATE_KIND(tessera::cuda)
#endif
#undef TESSERA_INSTANTIATE_KIND
#undef TESSERA_UNARY_OF_VAR
#undef TESSERA_BINARY_OF_VARS
TESSERA_INSTANTIATE(void tessera::fill_normal<float>(float*, std::int64_t, std::uint64_t,
                                                     std::uint64_t, double, double))
TESSERA_INSTANTIATE(void tessera::fill_uniform<float>(float*, std::int64_t, std::uint64_t,
                                                      std::uint64_t, double, double))
// The layouts of the CPU loops, by operand count.
TESSERA_INSTANTIATE(struct tessera::backend::cpu::strided_layout<2>)
TESSERA_INSTANTIATE(struct tessera::backend::cpu::strided_layout<3>)
TESSERA_INSTANTIATE(struct tessera::backend::cpu::strided_layout<4>)
TESSERA_INSTANTIATE(struct tessera::backend::cpu::strided_layout<5>)
TESSERA_INSTANTIATE(struct tessera::backend::cpu::split_layout<1>)
TESSERA_INSTANTIATE(struct tessera::backend::cpu::split_layout<2>)
TESSERA_INSTANTIATE(struct tessera::backend::cpu::split_layout<3>)
TESSERA_INSTANTIATE(struct tessera::backend::cpu::memory_order_layout<1>)
TESSERA_INSTANTIATE(struct tessera::backend::cpu::memory_order_layout<2>)
TESSERA_INSTANTIATE(struct tessera::backend::cpu::memory_order_layout<3>)
