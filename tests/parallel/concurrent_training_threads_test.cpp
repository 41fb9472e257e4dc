// Two threads training two independent MLPs on cpu:0 and cpu:1 at once give exactly (bit for bit)
// the losses, gradients and parameters of training them one after the other with the same thread
// counts: the current device, the pools, the RNG, the profiler counters and the BLAS and OpenMP
// thread settings are safe to use from two threads. (Tessera's own loops give the same bits for
// any thread count; OpenBLAS's sgemm does not, so the one-after-the-other runs use the counts the
// concurrent threads had.) Labelled `threads`, so the TSan build runs it.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "tessera/parallel.hpp"
#include "tessera/tessera.hpp"

namespace concurrent_training_threads_test {

namespace ts = tessera;
namespace ag = tessera::autograd;
namespace nn = tessera::nn;

// A 3-layer MLP whose weights come from the global generator: create models on one thread, in a
// fixed order, so their initial values do not depend on scheduling.
struct Net : nn::Module {
  nn::Linear<float> fc1, fc2, fc3;
  explicit Net(int device) : fc1(48, 96, true, device), fc2(96, 64, true, device), fc3(64, 10, true, device) {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
    register_module("fc3", fc3);
  }
  template <class X>
  auto forward(const X& x) const {
    return fc3(ts::relu(fc2(ts::tanh(fc1(x)))));
  }
};

struct Trained {
  std::vector<float> losses;
  std::vector<std::vector<float>> parameters;  // values after training, then gradients
};

// Trains `net` on device `device` for 4 Adam steps on a batch that depends on `seed`.
Trained train(Net& net, int device, int seed) {
  ts::DeviceGuard<ts::cpu> guard(device);
  const std::int64_t batch = 64;
  std::vector<float> xs(static_cast<std::size_t>(batch * 48));
  std::vector<std::int64_t> labels(static_cast<std::size_t>(batch));
  for (std::size_t i = 0; i < xs.size(); ++i) xs[i] = static_cast<float>(((static_cast<int>(i) * 7919 + seed * 104729) % 2001) - 1000) / 500.0f;
  for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<std::int64_t>((i * 3 + static_cast<std::size_t>(seed)) % 10);
  const auto x = ts::from_vector<float>(xs, {batch, 48}, device);
  const auto y = ts::from_vector<std::int64_t>(labels, {batch}, device);
  auto step = ag::compile([&](ag::Var<float> in) { return nn::cross_entropy(net.forward(in), y); },
                          ag::input<float>({batch, 48}, device));
  ts::optim::Adam adam(net.parameters(), {.lr = 0.01});
  Trained out;
  for (int i = 0; i < 4; ++i) {
    adam.zero_grad();
    out.losses.push_back(step.forward(x).item());
    step.backward();
    adam.step();
  }
  for (const auto& p : net.parameters()) out.parameters.push_back(p.value().as<float>().to_vector());
  for (const auto& p : net.parameters()) out.parameters.push_back(p.grad().as<float>().to_vector());
  return out;
}

bool same_bits(const Trained& a, const Trained& b) {
  auto same = [](const std::vector<float>& x, const std::vector<float>& y) {
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
  };
  if (!same(a.losses, b.losses) || a.parameters.size() != b.parameters.size()) return false;
  for (std::size_t i = 0; i < a.parameters.size(); ++i) {
    if (!same(a.parameters[i], b.parameters[i])) return false;
  }
  return true;
}

TEST_CASE("two MLPs trained at once on two devices match training them in turn", "[threads]") {
  ts::manual_seed(7);
  Net a0(0), b0(1);
  ts::manual_seed(7);
  Net a1(0), b1(1);
  ts::manual_seed(7);
  Net a2(0), b2(1);
  ts::manual_seed(7);
  Net a3(0), b3(1);

  // One after the other, each with the whole machine.
  const Trained a_alone = train(a0, 0, 1);
  const Trained b_alone = train(b0, 1, 2);
  CHECK(a_alone.losses.back() < a_alone.losses.front());
  CHECK(b_alone.losses.back() < b_alone.losses.front());

  // At once, on the runtime's device threads (each with half the cores) ...
  Trained a_team, b_team;
  ts::parallel::DeviceThreads<ts::cpu> threads({0, 1});
  int shares[2] = {0, 0};
  threads.run([&](int member) {
    shares[member] = ts::cpu::num_threads();
    if (member == 0) {
      a_team = train(a1, 0, 1);
    } else {
      b_team = train(b1, 1, 2);
    }
  });
  const int share = std::max(1, ts::cpu::core_count() / 2);
  CHECK(shares[0] == share);
  CHECK(shares[1] == share);
  // ... against one after the other with those counts.
  ts::cpu::set_num_threads(share, 0);
  ts::cpu::set_num_threads(share, 1);
  const Trained a_share = train(a3, 0, 1);
  const Trained b_share = train(b3, 1, 2);
  ts::cpu::set_num_threads(0, 0);
  ts::cpu::set_num_threads(0, 1);
  CHECK(same_bits(a_share, a_team));
  CHECK(same_bits(b_share, b_team));

  // At once, on two plain std::threads (each uses the whole machine: oversubscribed, same bits).
  Trained a_raw, b_raw;
  std::thread first([&] { a_raw = train(a2, 0, 1); });
  std::thread second([&] { b_raw = train(b2, 1, 2); });
  first.join();
  second.join();
  CHECK(same_bits(a_alone, a_raw));
  CHECK(same_bits(b_alone, b_raw));
}

}  // namespace concurrent_training_threads_test
