// ResNets as torchvision builds them (torchvision.models.resnet): BasicBlock and Bottleneck
// residual blocks, ResNet<Block, T, Kind, L1, L2, L3, L4> and resnet18/34/50/101/152 factories.
// Member names follow torchvision's, so a state dict's keys and shapes match torchvision's one to
// one (conv1.weight, bn1.running_mean, layer1.0.conv1.weight, layer2.0.downsample.0.weight,
// fc.bias, ...) and checkpoints load in both directions through safetensors. Initialisation as
// torchvision: kaiming_normal_(fan_out, relu) for convolutions, BatchNorm weight 1 and bias 0,
// Linear's default for fc. A 16-bit ResNet (resnet50<ts::half>, resnet50<ts::bfloat16>, or
// nn::to<ts::half>(model)) keeps its BatchNorm layers in float, the mixed-precision recipe
// (PyTorch's autocast runs batch norm in float too): they take and give the model's dtype at their
// boundary. Not part of tessera.hpp: include "tessera/models/resnet.hpp".
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "tessera/nn.hpp"

namespace tessera::models {

namespace detail {

/// x as a tensor (eager) or a Var (traced): a lazy expression is evaluated or bound once, so a
/// block that reads its input twice (the residual) neither computes it twice nor nests it into
/// ever longer expression types.
template <class T, class K, class X>
auto bind(const X& x) {
  if constexpr (nn::detail::is_eager_v<X>) {
    return Tensor<T, K>(x);
  } else {
    return autograd::Var<T, K>(x);
  }
}

/// The dtype of a ResNet's BatchNorm layers: float in a 16-bit model (as nn::to<ts::half> keeps
/// BatchNorm), the model's own otherwise.
template <Dtype T>
using norm_t = std::conditional_t<std::is_same_v<T, half> || std::is_same_v<T, bfloat16>, float, T>;

template <Dtype T, DeviceKind K>
using batch_norm_t = nn::BatchNorm2d<norm_t<T>, K>;

/// torchvision's initialisation of a convolution (skipped while a copy is made: the values are
/// filled in next).
template <Dtype T, DeviceKind K>
void kaiming_fan_out(const nn::Conv2d<T, K>& conv) {
  if (nn::detail::initialization_skipped()) return;
  nn::init::kaiming_normal_(conv.weight().value(), 0.0, nn::init::FanMode::fan_out, "relu");
}

template <Dtype T, DeviceKind K>
using downsample_t = nn::Sequential<nn::Conv2d<T, K>, batch_norm_t<T, K>>;

/// torchvision's downsample: a strided 1x1 convolution and a BatchNorm.
template <Dtype T, DeviceKind K>
downsample_t<T, K> make_downsample(std::int64_t in, std::int64_t out, std::int64_t stride,
                                   int device) {
  nn::Conv2d<T, K> conv(in, out, 1, {.stride = stride, .bias = false}, device);
  kaiming_fan_out(conv);
  return downsample_t<T, K>(conv, batch_norm_t<T, K>(out, 1e-5, 0.1, true, true, device));
}

}  // namespace detail

/// torchvision's BasicBlock (ResNet-18/34): 3x3, 3x3, and the identity or a downsample.
template <Dtype T, DeviceKind K = cpu>
class BasicBlock : public nn::Module {
 public:
  using value_type = T;
  using device_kind = K;
  static constexpr std::int64_t expansion = 1;

  BasicBlock(std::int64_t inplanes, std::int64_t planes, std::int64_t stride = 1,
             int device = -1)
      : Module("BasicBlock"),
        inplanes_(inplanes),
        planes_(planes),
        stride_(stride),
        conv1_(inplanes, planes, 3, {.stride = stride, .padding = 1, .bias = false}, device),
        bn1_(planes, 1e-5, 0.1, true, true, device),
        conv2_(planes, planes, 3, {.padding = 1, .bias = false}, device),
        bn2_(planes, 1e-5, 0.1, true, true, device) {
    detail::kaiming_fan_out(conv1_);
    detail::kaiming_fan_out(conv2_);
    register_module("conv1", conv1_);
    register_module("bn1", bn1_);
    register_module("conv2", conv2_);
    register_module("bn2", bn2_);
    if (stride != 1 || inplanes != planes * expansion) {
      downsample_.emplace(
          detail::make_downsample<T, K>(inplanes, planes * expansion, stride, device));
      register_module("downsample", *downsample_);
    }
  }
  BasicBlock(const BasicBlock&) = default;

  /// An independent copy on `device` of kind K2 (what ts::parallel::replicate uses).
  template <DeviceKind K2>
  BasicBlock<T, K2> copy_to(Device device) const {
    return nn::detail::converted<K2>(*this, device, [&] {
      return BasicBlock<T, K2>(inplanes_, planes_, stride_, device.index);
    });
  }
  /// An independent copy in dtype U (ts::nn::to<U>(block)); BatchNorm stays in float.
  template <Dtype U>
  BasicBlock<U, K> copy_as() const {
    const Device device = nn::detail::module_device(*this);
    return nn::detail::converted_as<K>(
        *this, device, [&] { return BasicBlock<U, K>(inplanes_, planes_, stride_, device.index); });
  }

  template <class X>
  auto forward(const X& x) const {
    const auto input = detail::bind<T, K>(x);
    const auto out = detail::bind<T, K>(bn1_.forward_relu(conv1_(input)));
    const auto branch = detail::bind<T, K>(bn2_(conv2_(out)));
    if (downsample_) return nn::functional::add_relu(branch, downsample_->forward(input));
    return nn::functional::add_relu(branch, input);
  }
  template <class X>
  auto operator()(const X& x) const {
    return forward(x);
  }

 private:
  std::int64_t inplanes_, planes_, stride_;
  nn::Conv2d<T, K> conv1_;
  detail::batch_norm_t<T, K> bn1_;
  nn::Conv2d<T, K> conv2_;
  detail::batch_norm_t<T, K> bn2_;
  std::optional<detail::downsample_t<T, K>> downsample_;
};

/// torchvision's Bottleneck (ResNet-50/101/152, "ResNet V1.5": the stride on the 3x3): 1x1
/// reduce, 3x3, 1x1 expand (x4), and the identity or a downsample.
template <Dtype T, DeviceKind K = cpu>
class Bottleneck : public nn::Module {
 public:
  using value_type = T;
  using device_kind = K;
  static constexpr std::int64_t expansion = 4;

  Bottleneck(std::int64_t inplanes, std::int64_t planes, std::int64_t stride = 1,
             int device = -1)
      : Module("Bottleneck"),
        inplanes_(inplanes),
        planes_(planes),
        stride_(stride),
        conv1_(inplanes, planes, 1, {.bias = false}, device),
        bn1_(planes, 1e-5, 0.1, true, true, device),
        conv2_(planes, planes, 3, {.stride = stride, .padding = 1, .bias = false}, device),
        bn2_(planes, 1e-5, 0.1, true, true, device),
        conv3_(planes, planes * expansion, 1, {.bias = false}, device),
        bn3_(planes * expansion, 1e-5, 0.1, true, true, device) {
    detail::kaiming_fan_out(conv1_);
    detail::kaiming_fan_out(conv2_);
    detail::kaiming_fan_out(conv3_);
    register_module("conv1", conv1_);
    register_module("bn1", bn1_);
    register_module("conv2", conv2_);
    register_module("bn2", bn2_);
    register_module("conv3", conv3_);
    register_module("bn3", bn3_);
    if (stride != 1 || inplanes != planes * expansion) {
      downsample_.emplace(
          detail::make_downsample<T, K>(inplanes, planes * expansion, stride, device));
      register_module("downsample", *downsample_);
    }
  }
  Bottleneck(const Bottleneck&) = default;

  /// An independent copy on `device` of kind K2 (what ts::parallel::replicate uses).
  template <DeviceKind K2>
  Bottleneck<T, K2> copy_to(Device device) const {
    return nn::detail::converted<K2>(*this, device, [&] {
      return Bottleneck<T, K2>(inplanes_, planes_, stride_, device.index);
    });
  }
  /// An independent copy in dtype U (ts::nn::to<U>(block)); BatchNorm stays in float.
  template <Dtype U>
  Bottleneck<U, K> copy_as() const {
    const Device device = nn::detail::module_device(*this);
    return nn::detail::converted_as<K>(
        *this, device, [&] { return Bottleneck<U, K>(inplanes_, planes_, stride_, device.index); });
  }

  template <class X>
  auto forward(const X& x) const {
    const auto input = detail::bind<T, K>(x);
    const auto a = detail::bind<T, K>(bn1_.forward_relu(conv1_(input)));
    const auto b = detail::bind<T, K>(bn2_.forward_relu(conv2_(a)));
    const auto branch = detail::bind<T, K>(bn3_(conv3_(b)));
    if (downsample_) return nn::functional::add_relu(branch, downsample_->forward(input));
    return nn::functional::add_relu(branch, input);
  }
  template <class X>
  auto operator()(const X& x) const {
    return forward(x);
  }

 private:
  std::int64_t inplanes_, planes_, stride_;
  nn::Conv2d<T, K> conv1_;
  detail::batch_norm_t<T, K> bn1_;
  nn::Conv2d<T, K> conv2_;
  detail::batch_norm_t<T, K> bn2_;
  nn::Conv2d<T, K> conv3_;
  detail::batch_norm_t<T, K> bn3_;
  std::optional<detail::downsample_t<T, K>> downsample_;
};

namespace detail {

template <class Block, std::size_t>
using same = Block;

/// `blocks` blocks of planes `planes`, the first with `stride` (torchvision's _make_layer);
/// `inplanes` is updated to the layer's output channels.
template <class Block, std::size_t... I>
nn::Sequential<same<Block, I>...> make_layer(std::int64_t& inplanes, std::int64_t planes,
                                             std::int64_t stride, int device,
                                             std::index_sequence<I...>) {
  const std::int64_t in = inplanes;
  inplanes = planes * Block::expansion;
  return nn::Sequential<same<Block, I>...>(
      Block(I == 0 ? in : planes * Block::expansion, planes, I == 0 ? stride : 1, device)...);
}

/// The blocks of a layer, as copies sharing its parameters and buffers.
template <class Layer, std::size_t... I>
auto blocks_of(const Layer& layer, std::index_sequence<I...>) {
  return std::tuple(layer.template get<I>()...);
}

template <class Block, std::size_t N>
using layer_t = decltype(make_layer<Block>(std::declval<std::int64_t&>(), 0, 1, 0,
                                           std::make_index_sequence<N>{}));

}  // namespace detail

/// A ResNet's stem as one module: conv1, bn1 with ReLU, 3x3/2 max pooling (shares the layers
/// it is given). A piece of ResNet::sequential().
template <Dtype T, DeviceKind K = cpu>
class ResNetStem : public nn::Module {
 public:
  ResNetStem(const nn::Conv2d<T, K>& conv1, const detail::batch_norm_t<T, K>& bn1)
      : Module("ResNetStem"), conv1_(conv1), bn1_(bn1), maxpool_(3, {.stride = 2, .padding = 1}) {
    register_module("conv1", conv1_);
    register_module("bn1", bn1_);
  }
  ResNetStem(const ResNetStem&) = default;

  /// An independent copy on `device` of kind K2 (what ts::parallel::replicate uses).
  template <DeviceKind K2>
  ResNetStem<T, K2> copy_to(Device device) const {
    return nn::detail::converted<K2>(*this, device, [&] {
      return ResNetStem<T, K2>(nn::detail::copy_to<K2>(conv1_, device),
                               nn::detail::copy_to<K2>(bn1_, device));
    });
  }
  template <class X>
  auto forward(const X& x) const {
    return maxpool_(bn1_.forward_relu(conv1_(x)));
  }
  template <class X>
  auto operator()(const X& x) const {
    return forward(x);
  }

 private:
  nn::Conv2d<T, K> conv1_;
  detail::batch_norm_t<T, K> bn1_;
  nn::MaxPool2d maxpool_;
};

/// A ResNet's head as one module: global average pooling, flatten, fc (shares the fc layer).
template <Dtype T, DeviceKind K = cpu>
class ResNetHead : public nn::Module {
 public:
  explicit ResNetHead(const nn::Linear<T, K>& fc) : Module("ResNetHead"), fc_(fc) {
    register_module("fc", fc_);
  }
  ResNetHead(const ResNetHead&) = default;

  /// An independent copy on `device` of kind K2 (what ts::parallel::replicate uses).
  template <DeviceKind K2>
  ResNetHead<T, K2> copy_to(Device device) const {
    return nn::detail::converted<K2>(
        *this, device, [&] { return ResNetHead<T, K2>(nn::detail::copy_to<K2>(fc_, device)); });
  }
  template <class X>
  auto forward(const X& x) const {
    return fc_(flatten_(avgpool_(x)));
  }
  template <class X>
  auto operator()(const X& x) const {
    return forward(x);
  }

 private:
  nn::AdaptiveAvgPool2d avgpool_{1};
  nn::Flatten flatten_;
  nn::Linear<T, K> fc_;
};

/// torchvision's ResNet: stem (7x7/2 convolution, BatchNorm, ReLU, 3x3/2 max pooling), four
/// layers of L1..L4 blocks (64, 128, 256, 512 planes; stride 2 from layer2 on), global average
/// pooling and a Linear classifier. Inputs [N, 3, H, W] (224x224 in ImageNet; any H, W >= 32
/// here).
template <template <class, class> class Block, Dtype T, DeviceKind K, std::size_t L1,
          std::size_t L2, std::size_t L3, std::size_t L4>
class ResNet : public nn::Module {
  using block = Block<T, K>;

 public:
  using value_type = T;
  using device_kind = K;

  explicit ResNet(std::int64_t num_classes = 1000, int device = -1)
      : ResNet(num_classes, device, 64) {}
  ResNet(const ResNet&) = default;

  /// An independent copy on `device` of kind K2 (what ts::parallel::replicate uses).
  template <DeviceKind K2>
  ResNet<Block, T, K2, L1, L2, L3, L4> copy_to(Device device) const {
    return nn::detail::converted<K2>(*this, device, [&] {
      return ResNet<Block, T, K2, L1, L2, L3, L4>(num_classes_, device.index);
    });
  }
  /// An independent copy in dtype U (ts::nn::to<ts::half>(model)): the convolutions and fc in
  /// U, the BatchNorm layers in float (norm_t), the values rounded to nearest even.
  template <Dtype U>
  ResNet<Block, U, K, L1, L2, L3, L4> copy_as() const {
    const Device device = nn::detail::module_device(*this);
    return nn::detail::converted_as<K>(*this, device, [&] {
      return ResNet<Block, U, K, L1, L2, L3, L4>(num_classes_, device.index);
    });
  }

  template <class X>
  auto forward(const X& x) const {
    const auto stem = detail::bind<T, K>(maxpool_(bn1_.forward_relu(conv1_(x))));
    const auto features = detail::bind<T, K>(layer4_(layer3_(layer2_(layer1_(stem)))));
    return fc_(flatten_(avgpool_(features)));
  }
  template <class X>
  auto operator()(const X& x) const {
    return forward(x);
  }

  const nn::Conv2d<T, K>& conv1() const noexcept { return conv1_; }
  const detail::batch_norm_t<T, K>& bn1() const noexcept { return bn1_; }
  const auto& layer1() const noexcept { return layer1_; }
  const auto& layer2() const noexcept { return layer2_; }
  const auto& layer3() const noexcept { return layer3_; }
  const auto& layer4() const noexcept { return layer4_; }
  const nn::Linear<T, K>& fc() const noexcept { return fc_; }

  /// The same layers as a flat Sequential of six modules: stem, layer1..layer4, head (sharing
  /// this model's parameters and buffers; keys "0.conv1.weight", "1.0.conv1.weight", ...), for
  /// ts::parallel::Pipeline's balance, e.g. {.balance = {3, 3}}.
  auto sequential() const {
    return nn::Sequential(ResNetStem<T, K>(conv1_, bn1_), layer1_, layer2_, layer3_, layer4_,
                          ResNetHead<T, K>(fc_));
  }

  /// The same layers as a flat Sequential of every block: stem, layer1's L1 blocks, ...,
  /// layer4's L4 blocks, head (L1 + L2 + L3 + L4 + 2 modules, sharing this model's parameters
  /// and buffers; keys "0.conv1.weight", "1.conv1.weight", ...), so that a Pipeline's balance
  /// can cut inside a layer (torchgpipe's flattened ResNets): e.g. ResNet-18 as {6, 4}.
  auto blocks() const {
    return std::apply(
        [&](const auto&... block) {
          return nn::Sequential(ResNetStem<T, K>(conv1_, bn1_), block..., ResNetHead<T, K>(fc_));
        },
        std::tuple_cat(detail::blocks_of(layer1_, std::make_index_sequence<L1>{}),
                       detail::blocks_of(layer2_, std::make_index_sequence<L2>{}),
                       detail::blocks_of(layer3_, std::make_index_sequence<L3>{}),
                       detail::blocks_of(layer4_, std::make_index_sequence<L4>{})));
  }

 private:
  ResNet(std::int64_t num_classes, int device, std::int64_t inplanes)
      : Module("ResNet"),
        num_classes_(num_classes),
        conv1_(3, 64, 7, {.stride = 2, .padding = 3, .bias = false}, device),
        bn1_(64, 1e-5, 0.1, true, true, device),
        maxpool_(3, {.stride = 2, .padding = 1}),
        layer1_(detail::make_layer<block>(inplanes, 64, 1, device, std::make_index_sequence<L1>{})),
        layer2_(detail::make_layer<block>(inplanes, 128, 2, device, std::make_index_sequence<L2>{})),
        layer3_(detail::make_layer<block>(inplanes, 256, 2, device, std::make_index_sequence<L3>{})),
        layer4_(detail::make_layer<block>(inplanes, 512, 2, device, std::make_index_sequence<L4>{})),
        avgpool_(1),
        fc_(512 * block::expansion, num_classes, true, device) {
    detail::kaiming_fan_out(conv1_);
    register_module("conv1", conv1_);
    register_module("bn1", bn1_);
    register_module("layer1", layer1_);
    register_module("layer2", layer2_);
    register_module("layer3", layer3_);
    register_module("layer4", layer4_);
    register_module("fc", fc_);
  }

  std::int64_t num_classes_;
  nn::Conv2d<T, K> conv1_;
  detail::batch_norm_t<T, K> bn1_;
  nn::MaxPool2d maxpool_;
  detail::layer_t<block, L1> layer1_;
  detail::layer_t<block, L2> layer2_;
  detail::layer_t<block, L3> layer3_;
  detail::layer_t<block, L4> layer4_;
  nn::AdaptiveAvgPool2d avgpool_;
  nn::Flatten flatten_;
  nn::Linear<T, K> fc_;
};

template <Dtype T, DeviceKind K = cpu>
using ResNet18 = ResNet<BasicBlock, T, K, 2, 2, 2, 2>;
template <Dtype T, DeviceKind K = cpu>
using ResNet34 = ResNet<BasicBlock, T, K, 3, 4, 6, 3>;
template <Dtype T, DeviceKind K = cpu>
using ResNet50 = ResNet<Bottleneck, T, K, 3, 4, 6, 3>;
template <Dtype T, DeviceKind K = cpu>
using ResNet101 = ResNet<Bottleneck, T, K, 3, 4, 23, 3>;
template <Dtype T, DeviceKind K = cpu>
using ResNet152 = ResNet<Bottleneck, T, K, 3, 8, 36, 3>;

/// torchvision.models.resnet18(num_classes = ...) and friends, on ordinal `device` of kind K.
template <Dtype T, DeviceKind K = cpu>
ResNet18<T, K> resnet18(std::int64_t num_classes = 1000, int device = -1) {
  return ResNet18<T, K>(num_classes, device);
}
template <Dtype T, DeviceKind K = cpu>
ResNet34<T, K> resnet34(std::int64_t num_classes = 1000, int device = -1) {
  return ResNet34<T, K>(num_classes, device);
}
template <Dtype T, DeviceKind K = cpu>
ResNet50<T, K> resnet50(std::int64_t num_classes = 1000, int device = -1) {
  return ResNet50<T, K>(num_classes, device);
}
template <Dtype T, DeviceKind K = cpu>
ResNet101<T, K> resnet101(std::int64_t num_classes = 1000, int device = -1) {
  return ResNet101<T, K>(num_classes, device);
}
template <Dtype T, DeviceKind K = cpu>
ResNet152<T, K> resnet152(std::int64_t num_classes = 1000, int device = -1) {
  return ResNet152<T, K>(num_classes, device);
}

}  // namespace tessera::models

namespace tessera::nn {
/// ResNet<Block, T, K, ...> on kind K2 (ts::nn::to<ts::cuda>(model, 0)).
template <template <class, class> class Block, Dtype T, DeviceKind K, std::size_t L1,
          std::size_t L2, std::size_t L3, std::size_t L4, DeviceKind K2>
struct rebind_kind<models::ResNet<Block, T, K, L1, L2, L3, L4>, K2> {
  using type = models::ResNet<Block, T, K2, L1, L2, L3, L4>;
};
/// ResNet<Block, T, K, ...> in dtype U (ts::nn::to<ts::half>(model)).
template <template <class, class> class Block, Dtype T, DeviceKind K, std::size_t L1,
          std::size_t L2, std::size_t L3, std::size_t L4, Dtype U>
struct rebind_dtype<models::ResNet<Block, T, K, L1, L2, L3, L4>, U> {
  using type = models::ResNet<Block, U, K, L1, L2, L3, L4>;
};
}  // namespace tessera::nn
