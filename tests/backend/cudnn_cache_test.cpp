// backend/cuda/cudnn_cache.hpp on the CPU, with made-up candidates: what the key tells apart,
// the choice among cuDNN's candidates under the switches (precision, determinism, workspace
// limit; heuristics' order or timings), the scratch sizes tried when timing, and the
// process-wide table (made once per key, addresses kept, nothing stored on a failure). Threads
// making and finding keys at once: cudnn_cache_threads_test.cpp (under TSan too).
#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <unordered_set>
#include <vector>

#include "tessera/backend/cuda/cudnn_cache.hpp"

namespace cudnn_cache_test {  // one namespace per file: a unity build

using namespace tessera::backend::cuda;

conv2d_key resnet_key() {
  conv2d_key k;
  k.problem = {8, 64, 56, 56, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1, 56, 56};
  k.direction = conv2d_direction::forward;
  k.device = 0;
  k.dtype = 0;
  k.allow_tf32 = false;
  k.deterministic = false;
  k.benchmark = false;
  k.workspace_limit = std::size_t{1} << 30;
  return k;
}

/// A candidate as cuDNN reports it: algorithm, math, ok, deterministic, time, workspace.
conv2d_candidate candidate(int algorithm, conv2d_math math, bool ok, bool deterministic,
                           float milliseconds, std::size_t workspace) {
  conv2d_candidate c;
  c.algorithm = algorithm;
  c.math = static_cast<int>(math);
  c.math_class = math;
  c.ok = ok;
  c.deterministic = deterministic;
  c.milliseconds = milliseconds;
  c.workspace = workspace;
  return c;
}

TEST_CASE("cudnn cache: every field of the key tells problems apart", "[cudnn][cache]") {
  const conv2d_key base = resnet_key();
  const conv2d_key_hash hash;
  std::vector<conv2d_key> variants;
  auto vary = [&](auto change) {
    conv2d_key k = base;
    change(k);
    variants.push_back(k);
  };
  vary([](conv2d_key& k) { k.problem.n = 32; });
  vary([](conv2d_key& k) { k.problem.c = 128; });
  vary([](conv2d_key& k) { k.problem.h = 28; });
  vary([](conv2d_key& k) { k.problem.w = 28; });
  vary([](conv2d_key& k) { k.problem.o = 256; });
  vary([](conv2d_key& k) { k.problem.kh = 1; });
  vary([](conv2d_key& k) { k.problem.kw = 1; });
  vary([](conv2d_key& k) { k.problem.sh = 2; });
  vary([](conv2d_key& k) { k.problem.sw = 2; });
  vary([](conv2d_key& k) { k.problem.ph = 0; });
  vary([](conv2d_key& k) { k.problem.pw = 0; });
  vary([](conv2d_key& k) { k.problem.dh = 2; });
  vary([](conv2d_key& k) { k.problem.dw = 2; });
  vary([](conv2d_key& k) { k.problem.groups = 2; });
  vary([](conv2d_key& k) { k.problem.oh = 55; });
  vary([](conv2d_key& k) { k.problem.ow = 55; });
  vary([](conv2d_key& k) { k.direction = conv2d_direction::backward_data; });
  vary([](conv2d_key& k) { k.direction = conv2d_direction::backward_filter; });
  vary([](conv2d_key& k) { k.device = 1; });
  vary([](conv2d_key& k) { k.dtype = 2; });
  vary([](conv2d_key& k) { k.problem.channels_last = true; });
  vary([](conv2d_key& k) { k.allow_tf32 = true; });
  vary([](conv2d_key& k) { k.deterministic = true; });
  vary([](conv2d_key& k) { k.benchmark = true; });
  vary([](conv2d_key& k) { k.workspace_limit = 0; });
  std::unordered_set<std::size_t> hashes{hash(base)};
  for (std::size_t i = 0; i < variants.size(); ++i) {
    INFO("variant " << i);
    CHECK_FALSE(variants[i] == base);
    hashes.insert(hash(variants[i]));
  }
  CHECK(hashes.size() == variants.size() + 1);  // no two of these collide
  // Equal keys hash equally.
  CHECK(hash(resnet_key()) == hash(base));
  CHECK(resnet_key() == base);
}

TEST_CASE("cudnn cache: the precision a candidate's math keeps", "[cudnn][cache]") {
  using enum conv2d_math;
  using P = conv2d_precision;
  CHECK(conv2d_keeps_precision(fma, P::fp32_products));
  for (const conv2d_math m : {default_math, tensor_op, tensor_op_allow_conversion}) {
    CHECK_FALSE(conv2d_keeps_precision(m, P::fp32_products));  // TF32 or half: not fp32
  }
  CHECK(conv2d_keeps_precision(fma, P::tf32_allowed));
  CHECK(conv2d_keeps_precision(default_math, P::tf32_allowed));
  CHECK(conv2d_keeps_precision(tensor_op, P::tf32_allowed));
  CHECK_FALSE(conv2d_keeps_precision(tensor_op_allow_conversion, P::tf32_allowed));
  for (const conv2d_math m : {fma, default_math, tensor_op, tensor_op_allow_conversion}) {
    CHECK(conv2d_keeps_precision(m, P::any));
  }
}

TEST_CASE("cudnn cache: the heuristics' first acceptable candidate", "[cudnn][cache]") {
  using enum conv2d_math;
  const std::size_t mib = std::size_t{1} << 20;
  // cuDNN's rank order: a failed one, a TF32 one, one needing 2 GiB, a nondeterministic one,
  // then a plain one.
  const std::vector<conv2d_candidate> ranked = {
      candidate(6, fma, false, true, -1, 0),
      candidate(1, tensor_op, true, true, -1, 4 * mib),
      candidate(5, fma, true, true, -1, 2048 * mib),
      candidate(3, fma, true, false, -1, 8 * mib),
      candidate(0, fma, true, true, -1, 0),
  };
  conv2d_requirements need{conv2d_precision::fp32_products, false, 1024 * mib};
  CHECK(conv2d_choose_candidate(ranked, need, false) == 3);
  need.only_deterministic = true;
  CHECK(conv2d_choose_candidate(ranked, need, false) == 4);
  need.only_deterministic = false;
  need.precision = conv2d_precision::tf32_allowed;
  CHECK(conv2d_choose_candidate(ranked, need, false) == 1);
  need.workspace_limit = 0;  // only the algorithm without workspace
  CHECK(conv2d_choose_candidate(ranked, need, false) == 4);
  need.workspace_limit = 4 * mib;  // exactly the limit fits
  CHECK(conv2d_choose_candidate(ranked, need, false) == 1);
  need.workspace_limit = 4 * mib - 1;
  CHECK(conv2d_choose_candidate(ranked, need, false) == 4);
  // Nothing acceptable: -1 (the caller runs im2col + cuBLAS).
  CHECK(conv2d_choose_candidate(std::vector<conv2d_candidate>{ranked[0], ranked[1]},
                                {conv2d_precision::fp32_products, false, 1024 * mib}, false) == -1);
  CHECK(conv2d_choose_candidate(std::vector<conv2d_candidate>{}, need, false) == -1);
}

TEST_CASE("cudnn cache: the fastest timed candidate", "[cudnn][cache]") {
  using enum conv2d_math;
  const std::size_t mib = std::size_t{1} << 20;
  // Timed results in an order that is not by time (the choice does not rely on cuDNN's sort).
  const std::vector<conv2d_candidate> timed = {
      candidate(0, fma, true, true, 0.90f, 0),
      candidate(1, fma, true, true, 0.40f, 64 * mib),
      candidate(2, fma, false, true, 0.01f, 0),          // failed: its time means nothing
      candidate(3, fma, true, false, 0.20f, 16 * mib),   // nondeterministic
      candidate(4, default_math, true, true, 0.10f, 0),  // TF32
      candidate(5, fma, true, true, 0.40f, 32 * mib),    // as fast as 1, less workspace
      candidate(6, fma, true, true, -1.0f, 0),           // not timed
  };
  conv2d_requirements need{conv2d_precision::fp32_products, false, 1024 * mib};
  CHECK(conv2d_choose_candidate(timed, need, true) == 3);
  need.only_deterministic = true;
  CHECK(conv2d_choose_candidate(timed, need, true) == 5);
  need.workspace_limit = 16 * mib;
  CHECK(conv2d_choose_candidate(timed, need, true) == 0);
  need.precision = conv2d_precision::tf32_allowed;
  CHECK(conv2d_choose_candidate(timed, need, true) == 4);
  need.precision = conv2d_precision::any;
  CHECK(conv2d_choose_candidate(timed, need, true) == 4);
  // Equal times and workspace: the earlier one.
  const std::vector<conv2d_candidate> tied = {candidate(7, fma, true, true, 0.5f, 0),
                                              candidate(8, fma, true, true, 0.5f, 0)};
  CHECK(conv2d_choose_candidate(tied, need, true) == 0);
}

TEST_CASE("cudnn cache: the scratch sizes tried when timing", "[cudnn][cache]") {
  const std::vector<std::size_t> workspaces = {0, 4096, 1 << 20, 4096, 3u << 30, 256};
  CHECK(conv2d_scratch_sizes(workspaces, std::size_t{1} << 30) ==
        std::vector<std::size_t>{1 << 20, 4096, 256, 0});
  CHECK(conv2d_scratch_sizes(workspaces, 4096) == std::vector<std::size_t>{4096, 256, 0});
  CHECK(conv2d_scratch_sizes(workspaces, 0) == std::vector<std::size_t>{0});
  CHECK(conv2d_scratch_sizes(std::vector<std::size_t>{}, 100) == std::vector<std::size_t>{0});
}

/// A made-up entry: what a cuDNN entry holds, without cuDNN.
struct fake_call {
  int algorithm = 0;
  std::size_t bytes = 0;
};

TEST_CASE("cudnn cache: an entry is made once per key and keeps its address", "[cudnn][cache]") {
  process_cache<conv2d_key, fake_call, conv2d_key_hash> cache;
  int made = 0;
  auto make = [&](int algorithm) {
    return [&made, algorithm] {
      ++made;
      return std::make_unique<fake_call>(fake_call{algorithm, 64});
    };
  };
  const conv2d_key forward = resnet_key();
  conv2d_key backward = forward;
  backward.direction = conv2d_direction::backward_data;
  const fake_call& a = cache.get(forward, make(1));
  const fake_call& b = cache.get(forward, make(2));  // found: not made again
  CHECK(&a == &b);
  CHECK(b.algorithm == 1);
  CHECK(made == 1);
  const fake_call& c = cache.get(backward, make(3));
  CHECK(c.algorithm == 3);
  CHECK(made == 2);
  CHECK(cache.find(forward) == &a);
  // Many more keys (the table rehashes): the first entries stay where they were.
  for (std::int64_t n = 1; n <= 1000; ++n) {
    conv2d_key k = forward;
    k.problem.n = 100 + n;
    (void)cache.get(k, [] { return fake_call{9, 0}; });  // a value, not a pointer, also works
  }
  CHECK(cache.size() == 1002);
  CHECK(cache.find(forward) == &a);
  CHECK(cache.find(backward) == &c);
  CHECK(a.algorithm == 1);
  conv2d_key unseen = forward;
  unseen.benchmark = true;
  CHECK(cache.find(unseen) == nullptr);
}

TEST_CASE("cudnn cache: a failed make stores nothing", "[cudnn][cache]") {
  process_cache<conv2d_key, fake_call, conv2d_key_hash> cache;
  const conv2d_key key = resnet_key();
  CHECK_THROWS_AS(
      cache.get(key,
                []() -> std::unique_ptr<fake_call> { throw std::runtime_error("cuDNN failed"); }),
      std::runtime_error);
  CHECK(cache.size() == 0);
  CHECK(cache.find(key) == nullptr);
  CHECK(cache.get(key, [] { return fake_call{4, 0}; }).algorithm == 4);  // made on the next call
}

}  // namespace cudnn_cache_test
