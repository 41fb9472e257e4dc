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
TESSERA_INSTANTIATE(class tessera::Tensor<float, tessera::cpu>)
TESSERA_INSTANTIATE(class tessera::Tensor<double, tessera::cpu>)
TESSERA_INSTANTIATE(class tessera::Tensor<std::int64_t, tessera::cpu>)
TESSERA_INSTANTIATE(class tessera::memory::pool_resource<
                    tessera::memory::limit_resource_adaptor<tessera::memory::host_memory_resource>,
                    tessera::memory::pytorch_size_policy, tessera::memory::host_stream_policy>)
TESSERA_INSTANTIATE(struct tessera::detail::safetensors::codec<0>)
// The fixed-type templates a float training program on CPU uses whatever its model: Linear, the
// GEMM paths, the autograd nodes of matmul, softmax and views, and the copies and fills they use.
TESSERA_INSTANTIATE(class tessera::nn::Linear<float, tessera::cpu>)
TESSERA_INSTANTIATE(void tessera::detail::matmul_into<float, tessera::cpu>(
    tessera::Tensor<float, tessera::cpu>&, const tessera::Tensor<float, tessera::cpu>&,
    const tessera::Tensor<float, tessera::cpu>&, bool))
TESSERA_INSTANTIATE(void tessera::detail::matmul_add_into<float, tessera::cpu>(
    tessera::Tensor<float, tessera::cpu>, const tessera::Tensor<float, tessera::cpu>&,
    const tessera::Tensor<float, tessera::cpu>&, bool, const tessera::Tensor<float, tessera::cpu>&))
TESSERA_INSTANTIATE(class tessera::autograd::detail::matmul_node<float, tessera::cpu>)
TESSERA_INSTANTIATE(class tessera::autograd::detail::softmax_node<float, tessera::cpu, true>)
TESSERA_INSTANTIATE(class tessera::autograd::detail::softmax_node<float, tessera::cpu, false>)
TESSERA_INSTANTIATE(class tessera::autograd::detail::view_node<float, tessera::cpu>)
TESSERA_INSTANTIATE(class tessera::autograd::detail::view_node<std::int64_t, tessera::cpu>)
TESSERA_INSTANTIATE(int tessera::autograd::detail::graph::add_parameter<float, tessera::cpu>(
    const std::shared_ptr<tessera::autograd::parameter_slot<float, tessera::cpu>>&))
TESSERA_INSTANTIATE(tessera::Tensor<std::int64_t, tessera::cpu>
                        tessera::arange<std::int64_t, tessera::cpu>(double, double, double, int))
TESSERA_INSTANTIATE(void tessera::Tensor<float, tessera::cpu>::copy_from<float, tessera::cpu>(
    const tessera::Tensor<float, tessera::cpu>&))
TESSERA_INSTANTIATE(
    void tessera::Tensor<std::int64_t, tessera::cpu>::copy_from<std::int64_t, tessera::cpu>(
        const tessera::Tensor<std::int64_t, tessera::cpu>&))
TESSERA_INSTANTIATE(
    void tessera::detail::add_into<float, tessera::cpu, tessera::Tensor<float, tessera::cpu>>(
        const tessera::Tensor<float, tessera::cpu>&, const tessera::Tensor<float, tessera::cpu>&))
TESSERA_INSTANTIATE(
    tessera::Tensor<float, tessera::cpu> tessera::AnyTensor::as<float, tessera::cpu>() const)
TESSERA_INSTANTIATE(tessera::Tensor<float, tessera::cpu>
                        tessera::autograd::detail::value_table::get<float, tessera::cpu>(
                            int, const tessera::Shape&, bool) const)
TESSERA_INSTANTIATE(tessera::Tensor<float, tessera::cpu>
                        tessera::autograd::detail::value_table::scratch_tensor<float, tessera::cpu>(
                            const tessera::Shape&))
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
// Sums and means of a float tensor (a bias's gradient, a mean loss), whatever the program.
TESSERA_INSTANTIATE(void tessera::detail::reduce_all_into<
                    tessera::backend::sum_op<float>, tessera::backend::finish_value, float,
                    tessera::detail::tensor_leaf<float, tessera::cpu>>(
    const tessera::Tensor<float, tessera::cpu>&,
    const tessera::detail::tensor_leaf<float, tessera::cpu>&, const char*))
TESSERA_INSTANTIATE(void tessera::detail::reduce_all_into<
                    tessera::backend::sum_op<float>, tessera::backend::finish_mean, float,
                    tessera::detail::tensor_leaf<float, tessera::cpu>>(
    const tessera::Tensor<float, tessera::cpu>&,
    const tessera::detail::tensor_leaf<float, tessera::cpu>&, const char*))
TESSERA_INSTANTIATE(void tessera::detail::reduce_dim_into<
                    tessera::backend::sum_op<float>, tessera::backend::finish_value, float,
                    tessera::detail::tensor_leaf<float, tessera::cpu>>(
    const tessera::Tensor<float, tessera::cpu>&,
    const tessera::detail::tensor_leaf<float, tessera::cpu>&, int, const char*))
TESSERA_INSTANTIATE(void tessera::detail::reduce_dim_into<
                    tessera::backend::sum_op<float>, tessera::backend::finish_mean, float,
                    tessera::detail::tensor_leaf<float, tessera::cpu>>(
    const tessera::Tensor<float, tessera::cpu>&,
    const tessera::detail::tensor_leaf<float, tessera::cpu>&, int, const char*))
// Traced cross_entropy and nll_loss (one node), their targets' check and the kernels of their
// options (eager and traced).
TESSERA_INSTANTIATE(class tessera::nn::detail::cross_entropy_node<float, tessera::cpu>)
TESSERA_INSTANTIATE(bool tessera::nn::detail::check_targets<tessera::cpu>(
    const tessera::Tensor<std::int64_t, tessera::cpu>&, std::int64_t, std::int64_t, const char*))
TESSERA_INSTANTIATE(void tessera::nn::detail::class_loss_forward<float, tessera::cpu>(
    const tessera::Tensor<float, tessera::cpu>&, const tessera::Tensor<float, tessera::cpu>&,
    const tessera::Tensor<std::int64_t, tessera::cpu>&,
    const tessera::Tensor<std::int64_t, tessera::cpu>&, const tessera::Tensor<float, tessera::cpu>&,
    const tessera::nn::detail::class_loss_options&,
    const tessera::nn::detail::class_loss_buffers<float, tessera::cpu>&))
TESSERA_INSTANTIATE(void tessera::nn::detail::class_loss_backward<float, tessera::cpu>(
    const tessera::Tensor<float, tessera::cpu>&, bool, const tessera::Tensor<float, tessera::cpu>&,
    const tessera::Tensor<float, tessera::cpu>&,
    const tessera::Tensor<std::int64_t, tessera::cpu>&,
    const tessera::Tensor<std::int64_t, tessera::cpu>&, const tessera::Tensor<float, tessera::cpu>&,
    const tessera::nn::detail::class_loss_options&,
    const tessera::nn::detail::class_loss_buffers<float, tessera::cpu>&))
