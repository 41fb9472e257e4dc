// What tests/cuda_gxx/training_test.cpp runs, compiled twice: by g++ in that file, a unit without
// kernels of its own (the library's layers, losses and optimisers run tessera::compiled's kernels,
// and the unit's own expressions run one operation at a time), and by nvcc in nvcc_twin.cu, a unit
// that fuses its expressions into kernels of its own. Included inside a namespace of each file.
// The same seeds give the same numbers on the CPU and on CUDA (random numbers are drawn on the
// host), so each function runs for either device kind.
#include <cstdint>
#include <vector>

using run_result = cuda_gxx_test::run_result;

template <class T, class K>
void append(std::vector<double>& out, const ts::Tensor<T, K>& t) {
  for (const T v : t.contiguous().to_vector()) out.push_back(static_cast<double>(v));
}

template <class K, class M>
void append_parameters(run_result& result, M& model) {
  for (const auto& [name, parameter] : model.named_parameters()) {
    (void)name;
    append(result.parameters, parameter.value().template as<float, K>().cpu(0));
  }
}

/// Linear, ReLU, Linear; cross_entropy; Adam.
template <class K>
run_result train_mlp(int steps) {
  ts::manual_seed(11);
  ts::nn::Sequential model(ts::nn::Linear<float, K>(12, 32, true, 0), ts::nn::ReLU(),
                           ts::nn::Linear<float, K>(32, 5, true, 0));
  auto program = ts::autograd::compile(
      [&](ts::autograd::Var<float, K> x, ts::autograd::Var<std::int64_t, K> y) {
        return ts::nn::cross_entropy(model(x), y);
      },
      ts::autograd::input<float, K>({16, 12}, 0), ts::autograd::input<std::int64_t, K>({16}, 0));
  ts::optim::Adam adam(model.parameters(), {.lr = 1e-2});
  run_result result;
  for (int step = 0; step < steps; ++step) {
    const auto x = ts::randn<float, K>({16, 12}, 0);
    std::vector<std::int64_t> classes(16);
    for (std::size_t n = 0; n < classes.size(); ++n) classes[n] = static_cast<std::int64_t>(n % 5);
    const auto labels = ts::from_vector<std::int64_t, K>(classes, {16}, 0);
    adam.zero_grad();
    result.losses.push_back(program.forward(x, labels).cpu(0).item());
    program.backward();
    adam.step();
  }
  append_parameters<K>(result, model);
  return result;
}

/// A convolutional net with batch norm, max pooling, a sigmoid followed by dropout (an expression
/// the library does not fuse for itself), tanh and mse_loss; SGD with momentum and weight decay.
template <class K>
struct ConvNet : ts::nn::Module {
  ts::nn::Conv2d<float, K> conv{3, 8, 3, {.padding = 1}, 0};
  ts::nn::BatchNorm2d<float, K> bn{8, 1e-5, 0.1, true, true, 0};
  ts::nn::Linear<float, K> fc1{8 * 4 * 4, 16, true, 0};
  ts::nn::Linear<float, K> fc2{16, 3, true, 0};
  ts::nn::MaxPool2d pool{2};
  ts::nn::Dropout dropout{0.25};
  ConvNet() : Module("ConvNet") {
    register_module("conv", conv);
    register_module("bn", bn);
    register_module("fc1", fc1);
    register_module("fc2", fc2);
  }
  template <class X>
  auto forward(const X& x) const {
    const auto h = pool(ts::relu(bn(conv(x))));
    const auto flat = h.view({h.size(0), 8 * 4 * 4});
    return ts::tanh(fc2(dropout(ts::sigmoid(fc1(flat)))));
  }
};

template <class K>
run_result train_conv(int steps) {
  ts::manual_seed(12);
  ConvNet<K> model;
  auto program = ts::autograd::compile(
      [&](ts::autograd::Var<float, K> x, ts::autograd::Var<float, K> y) {
        return ts::nn::mse_loss(model.forward(x), y);
      },
      ts::autograd::input<float, K>({4, 3, 8, 8}, 0), ts::autograd::input<float, K>({4, 3}, 0));
  ts::optim::SGD sgd(model.parameters(), {.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-3});
  run_result result;
  for (int step = 0; step < steps; ++step) {
    const auto x = ts::randn<float, K>({4, 3, 8, 8}, 0);
    const auto y = ts::rand<float, K>({4, 3}, 0);
    sgd.zero_grad();
    result.losses.push_back(program.forward(x, y).cpu(0).item());
    program.backward();
    sgd.step();
  }
  append_parameters<K>(result, model);
  append(result.parameters, model.bn.running_mean().value().cpu(0));
  append(result.parameters, model.bn.running_var().value().cpu(0));
  return result;
}

/// Expressions a user writes on tensors: elementwise, with numbers and broadcasting, casts and
/// comparisons, reductions and softmax of expressions, in-place updates.
template <class K>
std::vector<double> eager_expressions() {
  ts::manual_seed(13);
  const auto a = ts::randn<float, K>({6, 10}, 0);
  const auto b = ts::randn<float, K>({10}, 0);
  const auto i = ts::arange<std::int64_t, K>(0, 60, 1, 0).view({6, 10});
  std::vector<double> out;
  const ts::Tensor<float, K> y = ts::relu(a * 2 + b) - 1.0 / (1.0 + ts::exp(-a));
  append(out, y);
  const ts::Tensor<float, K> z =
      ts::where(a > b, a, ts::pow(b, 2) * 0.5) + ts::cast<float>(i > 30) - i;
  append(out, z);
  append(out, ts::sum(a * b));
  append(out, ts::mean(a * a, 1));
  append(out, ts::max(a - b, 0));
  append(out, ts::argmax(a * b, 1));
  append(out, ts::softmax(a * 3, 1));
  append(out, ts::log_softmax(i, 0));
  append(out, ts::sum(a > 0));
  auto w = a.clone();
  w += b * 3;
  w *= 0.5;
  append(out, w);
  append(out, a.template to<ts::half>().template to<float>());
  // Longer rows: 16-byte loads, several rows a block, a full reduction split over blocks (the
  // library's primitives take one kernel for every layout: backend::cuda::kernel_choice::fewest).
  const auto c = ts::randn<float, K>({48, 1024}, 0);
  append(out, ts::mean(c, 1));
  append(out, ts::mean(c * 2, 0));
  append(out, ts::max(c, 1));
  append(out, ts::mean(c));
  // Full reductions of a transposed view (the primitives copy it contiguous first): the
  // flattened index is the view's row-major order.
  append(out, ts::max(c.t()));
  append(out, ts::argmax(c.t()));
  append(out, ts::argmin(c.t() * 3));
  append(out, ts::softmax(c, 1));
  const ts::Tensor<float, K> d = c * 0.5 + 1;
  append(out, d);
  return out;
}
