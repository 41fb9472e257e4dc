// ResNet-50's convolution layer shapes that conv_bench (CPU) and cuda_bench (GPU) time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::bench {

/// A convolution without bias: c -> o channels, a k x k kernel, on hw x hw inputs.
struct conv_layer {
  std::string name;
  std::int64_t c, o, k, stride, padding, hw;
};

inline const std::vector<conv_layer>& resnet50_conv_layers() {
  static const std::vector<conv_layer> all = {
      {"3x3_64_56", 64, 64, 3, 1, 1, 56},        // layer1.*.conv2
      {"3x3_256_14", 256, 256, 3, 1, 1, 14},     // layer3.*.conv2
      {"1x1_256to64_56", 256, 64, 1, 1, 0, 56},  // layer1.*.conv1
      {"3x3s2_128_56", 128, 128, 3, 2, 1, 56},   // layer2.0.conv2
      {"3x3s2_256_28", 256, 256, 3, 2, 1, 28},   // layer3.0.conv2
      {"3x3s2_512_14", 512, 512, 3, 2, 1, 14},   // layer4.0.conv2
      {"7x7s2_stem_224", 3, 64, 7, 2, 3, 224},   // conv1
  };
  return all;
}

/// The output's height and width.
inline std::int64_t out_extent(const conv_layer& l) {
  return (l.hw + 2 * l.padding - l.k) / l.stride + 1;
}

}  // namespace tessera::bench
