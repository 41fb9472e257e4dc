// DataLoader and TensorDataset (data/data_loader.hpp): every batch against the rows it must hold
// (computed here from the example indices), the shuffled order a permutation that depends only
// on seed and epoch (the same with 0, 1 and 4 workers), drop_last, kept batches that keep their
// values while the buffers of dropped ones are reused, a dataset's exception reaching the loop
// with its batch and example, an early break, bad options, and pin_memory without a CUDA device
// (the same batches, not pinned). Labelled `threads` (workers), so the TSan build runs it.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "tessera/data/data_loader.hpp"
#include "tessera/tessera.hpp"

namespace data_loader_threads_test {

namespace ts = tessera;
using ts::data::DataLoader;
using ts::data::TensorDataset;

constexpr std::int64_t examples = 23;

// Example i: x = [10 i, 10 i + 1, 10 i + 2], y = i.
TensorDataset<float, std::int64_t> make_dataset() {
  std::vector<float> x;
  std::vector<std::int64_t> y;
  for (std::int64_t i = 0; i < examples; ++i) {
    for (int c = 0; c < 3; ++c) x.push_back(static_cast<float>(10 * i + c));
    y.push_back(i);
  }
  return TensorDataset<float, std::int64_t>(ts::from_vector<float>(x, {examples, 3}),
                                            ts::from_vector<std::int64_t>(y, {examples}));
}

// Every batch's x rows are those of its y indices; returns the indices in visiting order.
template <class Loader>
std::vector<std::int64_t> visit(Loader& loader, std::vector<std::int64_t>* sizes = nullptr) {
  std::vector<std::int64_t> seen;
  for (auto [x, y] : loader) {
    REQUIRE(x.dim() == 2);
    REQUIRE(x.size(0) == y.size(0));
    if (sizes) sizes->push_back(y.size(0));
    const auto xs = x.to_vector();
    const auto ys = y.to_vector();
    for (std::size_t j = 0; j < ys.size(); ++j) {
      for (std::size_t c = 0; c < 3; ++c) {
        REQUIRE(xs[j * 3 + c] == static_cast<float>(10 * ys[j] + static_cast<std::int64_t>(c)));
      }
      seen.push_back(ys[j]);
    }
  }
  return seen;
}

TEST_CASE("batches follow the dataset in order without shuffle", "[data]") {
  for (int workers : {0, 1, 3}) {
    CAPTURE(workers);
    DataLoader loader(make_dataset(), {.batch_size = 5, .num_workers = workers});
    REQUIRE(loader.size() == 5);
    std::vector<std::int64_t> sizes;
    const auto seen = visit(loader, &sizes);
    std::vector<std::int64_t> want(examples);
    std::iota(want.begin(), want.end(), 0);
    CHECK(seen == want);
    CHECK(sizes == std::vector<std::int64_t>{5, 5, 5, 5, 3});
  }
}

TEST_CASE("drop_last drops the short batch", "[data]") {
  DataLoader loader(make_dataset(), {.batch_size = 5, .drop_last = true, .num_workers = 2});
  REQUIRE(loader.size() == 4);
  std::vector<std::int64_t> sizes;
  const auto seen = visit(loader, &sizes);
  CHECK(sizes == std::vector<std::int64_t>{5, 5, 5, 5});
  CHECK(seen.size() == 20);
}

TEST_CASE("the shuffled order depends only on seed and epoch", "[data]") {
  std::vector<std::vector<std::int64_t>> epochs_by_workers;
  for (int workers : {0, 1, 4}) {
    DataLoader loader(make_dataset(),
                      {.batch_size = 4, .shuffle = true, .num_workers = workers, .seed = 7});
    std::vector<std::int64_t> both;
    for (int epoch = 0; epoch < 2; ++epoch) {
      const auto seen = visit(loader);
      // A permutation of every example.
      REQUIRE(std::set<std::int64_t>(seen.begin(), seen.end()).size() ==
              static_cast<std::size_t>(examples));
      REQUIRE(seen.size() == static_cast<std::size_t>(examples));
      both.insert(both.end(), seen.begin(), seen.end());
    }
    CHECK(loader.epoch() == 2);
    epochs_by_workers.push_back(both);
  }
  CHECK(epochs_by_workers[0] == epochs_by_workers[1]);
  CHECK(epochs_by_workers[0] == epochs_by_workers[2]);
  const std::vector<std::int64_t> first(epochs_by_workers[0].begin(),
                                        epochs_by_workers[0].begin() + examples);
  const std::vector<std::int64_t> second(epochs_by_workers[0].begin() + examples,
                                         epochs_by_workers[0].end());
  CHECK(first != second);  // a new order each epoch
  std::vector<std::int64_t> identity(examples);
  std::iota(identity.begin(), identity.end(), 0);
  CHECK(first != identity);

  DataLoader again(make_dataset(), {.batch_size = 4, .shuffle = true, .seed = 7});
  again.set_epoch(1);
  CHECK(visit(again) == second);  // set_epoch reproduces an epoch
  DataLoader other(make_dataset(), {.batch_size = 4, .shuffle = true, .seed = 8});
  CHECK(visit(other) != first);
}

TEST_CASE("kept batches keep their values; dropped buffers are reused", "[data]") {
  DataLoader loader(make_dataset(), {.batch_size = 2, .num_workers = 2, .prefetch_factor = 1});
  std::vector<std::tuple<ts::Tensor<float>, ts::Tensor<std::int64_t>>> kept;
  for (auto batch : loader) kept.push_back(batch);
  REQUIRE(kept.size() == 12);
  for (const auto& [x, y] : kept) {
    const auto xs = x.to_vector();
    const auto ys = y.to_vector();
    for (std::size_t j = 0; j < ys.size(); ++j) {
      CHECK(xs[j * 3] == static_cast<float>(10 * ys[j]));
    }
  }
  // Not kept: the ring's two buffers (an x and a y each) serve every batch of two, and the
  // short last batch gets its own: 6 allocations for 12 batches, not 24.
  const ts::Device cpu0{ts::DeviceType::cpu, 0};
  const auto before = ts::memory::stats(cpu0).allocations.allocated;
  std::int64_t batches = 0;
  for (auto [x, y] : loader) batches += x.size(0) > 0;
  CHECK(batches == 12);
  CHECK(ts::memory::stats(cpu0).allocations.allocated - before == 6);
}

TEST_CASE("pin_memory gives the same batches; without a CUDA device they are not pinned",
          "[data][pin_memory]") {
  // With pin_memory the values come from pinned buffers (with a CUDA device, as the CUDA tests
  // check) or, without one, from the ordinary ring: the same rows either way, checked against
  // the dataset's own values, in the same order as without the option.
  for (int workers : {0, 2}) {
    DataLoader plain(make_dataset(),
                     {.batch_size = 4, .shuffle = true, .num_workers = workers, .seed = 7});
    DataLoader pinned(make_dataset(), {.batch_size = 4,
                                       .shuffle = true,
                                       .num_workers = workers,
                                       .pin_memory = true,
                                       .seed = 7});
    CHECK(pinned.options().pin_memory);
    CHECK_FALSE(plain.pinned());
    CHECK(pinned.pinned() == ts::cuda::is_available());
    for (int epoch = 0; epoch < 2; ++epoch) {
      std::vector<std::int64_t> sizes;
      const auto seen = visit(pinned, &sizes);  // every row against its index's values
      CHECK(seen == visit(plain));  // the plain loader's batches of the same epoch
      CHECK(sizes == std::vector<std::int64_t>{4, 4, 4, 4, 4, 3});
    }
    for (auto [x, y] : pinned) {
      CHECK(x.is_pinned() == pinned.pinned());
      CHECK(y.is_pinned() == pinned.pinned());
    }
  }
}

// Example 13 cannot be read.
struct failing_dataset {
  std::int64_t size() const { return 20; }
  ts::Tensor<float> get(std::int64_t i) const {
    if (i == 13) throw std::runtime_error("the file of example 13 is damaged");
    return ts::full<float>({2}, static_cast<float>(i));
  }
};

TEST_CASE("a dataset's exception reaches the loop with its batch and example", "[data]") {
  for (int workers : {0, 2}) {
    CAPTURE(workers);
    DataLoader loader(failing_dataset{}, {.batch_size = 4, .num_workers = workers});
    std::vector<float> firsts;
    try {
      for (auto x : loader) firsts.push_back(x[0][0].item());
      FAIL("no error");
    } catch (const ts::error& e) {
      const std::string message = e.what();
      CHECK(message.find("batch 3 (example 13)") != std::string::npos);
      CHECK(message.find("damaged") != std::string::npos);
    }
    CHECK(firsts == std::vector<float>{0, 4, 8});  // the batches before it arrived
  }
}

#if defined(__linux__)
// Records the scheduling policy of the thread that reads each example.
struct policy_dataset {
  std::shared_ptr<std::vector<int>> policies = std::make_shared<std::vector<int>>(8, -1);
  std::int64_t size() const { return 8; }
  ts::Tensor<float> get(std::int64_t i) const {
    int policy = -1;
    sched_param param{};
    (void)pthread_getschedparam(pthread_self(), &policy, &param);
    (*policies)[static_cast<std::size_t>(i)] = policy;  // each example read by one thread
    return ts::full<float>({1}, static_cast<float>(i));
  }
};

TEST_CASE("workers are batch threads for the scheduler; the loop's own thread is left alone",
          "[data]") {
  int own = -1;
  sched_param param{};
  REQUIRE(pthread_getschedparam(pthread_self(), &own, &param) == 0);
  for (int workers : {0, 2}) {
    CAPTURE(workers);
    policy_dataset dataset;
    DataLoader loader(dataset, {.batch_size = 2, .num_workers = workers});
    float total = 0;
    for (auto x : loader) total += x[0][0].item() + x[1][0].item();
    CHECK(total == 28);
    for (int policy : *dataset.policies) CHECK(policy == (workers == 0 ? own : SCHED_BATCH));
  }
  int after = -1;
  REQUIRE(pthread_getschedparam(pthread_self(), &after, &param) == 0);
  CHECK(after == own);
}
#endif

TEST_CASE("leaving an epoch early stops its workers", "[data]") {
  DataLoader loader(make_dataset(), {.batch_size = 1, .shuffle = true, .num_workers = 3});
  int taken = 0;
  for (auto batch : loader) {
    (void)batch;
    if (++taken == 2) break;
  }
  CHECK(taken == 2);
  CHECK(visit(loader).size() == static_cast<std::size_t>(examples));  // the next epoch is whole
}

TEST_CASE("bad options and datasets are refused, naming the values", "[data]") {
  CHECK_THROWS_WITH(DataLoader(make_dataset(), {.batch_size = 0}),
                    Catch::Contains("batch_size 0"));
  CHECK_THROWS_WITH(DataLoader(make_dataset(), {.num_workers = -1}),
                    Catch::Contains("num_workers -1"));
  CHECK_THROWS_WITH(DataLoader(make_dataset(), {.prefetch_factor = 0}),
                    Catch::Contains("prefetch_factor 0"));
  using Pair = TensorDataset<float, float>;
  CHECK_THROWS_WITH(Pair(ts::zeros<float>({4, 2}), ts::zeros<float>({5})),
                    Catch::Contains("4 and 5 examples"));
}

}  // namespace data_loader_threads_test
