// Distributed data parallel training, one process per device, launched by mpirun:
//
//     mpirun -np 2 build/cpu/examples/ddp        # two processes on this machine's CPU
//     mpirun -np 2 build/cuda/examples/ddp       # two GPUs, when every rank has one of its own
//
// (as root add --allow-run-as-root; with more processes than cores, --oversubscribe). Built with
// CUDA and run where every rank of the node has a GPU of its own, the model and the data go to
// the rank's GPU (ts::distributed::init bound it) and the gradients are averaged through NCCL;
// otherwise everything runs on the CPU and MPI averages them. The GPU form has not run yet (no
// GPU was available when it was written). Every rank
// builds the same model with its own seed; DistributedDataParallel copies rank 0's values into
// all of them, each rank trains on its own shard of the data set, and backward averages the
// gradients across the ranks while it runs, so every rank takes the same optimiser step. Rank 0
// prints the global loss (the ranks' mean), checks that the ranks' parameters agree, and saves a
// checkpoint with PyTorch's `module.` prefix, which loads into a plain model. Run without mpirun
// it is a world of one, and trains on the whole data set.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <type_traits>

#include "tessera/distributed.hpp"
#include "tessera/tessera.hpp"

namespace ts = tessera;
namespace ag = tessera::autograd;
namespace nn = tessera::nn;
namespace dist = tessera::distributed;

template <class K>
struct Net : nn::Module {
  nn::Linear<float, K> fc1{2, 64}, fc2{64, 64}, fc3{64, 3};
  Net() {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
    register_module("fc3", fc3);
  }
  template <class X>
  auto forward(const X& x) const {
    return fc3(ts::relu(fc2(ts::relu(fc1(x)))));
  }
};

// Points in the plane, labelled by which of three rays they are closest to in angle.
void make_data(int n, std::vector<float>& points, std::vector<std::int64_t>& labels) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> uniform(-1, 1);
  for (int i = 0; i < n; ++i) {
    const float x = uniform(rng), y = uniform(rng);
    points.push_back(x);
    points.push_back(y);
    const double angle = std::atan2(y, x) + M_PI;
    labels.push_back(static_cast<std::int64_t>(angle / (2 * M_PI / 3)) % 3);
  }
}

// Trains on the rank's current device of kind K (made current by ts::distributed::init).
template <class K>
int train(dist::ProcessGroup& world) {
  const int rank = world.rank(), size = world.size();

  // The global batch of 1536 points, split evenly: rank r trains on rows [r * n, (r + 1) * n).
  const int global = 1536;
  if (global % size != 0) {
    if (rank == 0) std::printf("run with a process count that divides %d\n", global);
    return 1;
  }
  const int n = global / size;
  std::vector<float> points;
  std::vector<std::int64_t> labels;
  make_data(global, points, labels);
  const auto all_inputs = ts::from_vector<float>(points, {global, 2});
  const auto all_targets = ts::from_vector<std::int64_t>(labels, {global});
  const auto inputs = all_inputs.narrow(0, rank * n, n).template to<K>();
  const auto targets = all_targets.narrow(0, rank * n, n).template to<K>();

  ts::manual_seed(static_cast<std::uint64_t>(rank));  // different on every rank: DDP aligns them
  Net<K> model;
  ts::parallel::DistributedDataParallel ddp(model);
  auto step = ddp.compile(
      [](Net<K>& m, ag::Var<float, K> x, ag::Var<std::int64_t, K> y) {
        return nn::cross_entropy(m.forward(x), y);
      },
      ag::input<float, K>({n, 2}), ag::input<std::int64_t, K>({n}));
  ts::optim::Adam adam(model.parameters(), {.lr = 0.01});
  if (rank == 0) {
    std::printf("%d process(es) on %s, %d samples each, %zu gradient bucket(s)\n", size,
                std::is_same_v<K, ts::cpu> ? "the CPU" : "GPUs", n, ddp.buckets().size());
  }

  auto global_loss = [&](double local) {
    auto t = ts::from_vector<double>({local}, {1});
    world.all_reduce(t, ts::parallel::ReduceOp::avg);
    return t.item();
  };
  double first = 0, loss = 0;
  for (int epoch = 0; epoch < 200; ++epoch) {
    adam.zero_grad();
    const double local = step.forward(inputs, targets).item();
    step.backward();  // the average gradient over every rank's shard, in every rank
    adam.step();
    loss = global_loss(local);
    if (epoch == 0) first = loss;
    if (rank == 0 && epoch % 40 == 0) std::printf("epoch %3d  loss %.4f\n", epoch, loss);
  }
  if (rank == 0) std::printf("loss %.4f -> %.4f\n", first, loss);

  // Every rank took the same steps: their parameters agree with rank 0's exactly.
  int differing = 0;
  for (const auto& p : model.parameters()) {
    auto mine = p.value().template as<float, K>().template to<ts::cpu>().clone();
    auto rank0 = mine.clone();
    world.broadcast(rank0, 0);
    differing += mine.to_vector() != rank0.to_vector();
  }
  auto total = ts::from_vector<std::int32_t>({differing}, {1});
  world.all_reduce(total);
  if (rank == 0) {
    std::printf("parameters that differ from rank 0's on some rank: %d\n", total.item());
  }

  int status = !(loss < 0.5 * first) || total.item() != 0;
  if (rank == 0) {
    // A checkpoint as torch DDP writes it ("module.fc1.weight", ...); a plain Net loads it.
    const auto path = (std::filesystem::temp_directory_path() / "tessera_ddp.safetensors").string();
    ts::save(ddp.state_dict(), path);
    Net<ts::cpu> fresh;  // a plain model on the CPU, whatever trained it
    fresh.load_state_dict(ts::load(path));
    const auto a = ts::argmax(fresh.forward(all_inputs), 1).to_vector();
    const auto b = ts::argmax(model.forward(all_inputs.template to<K>()), 1)
                       .template to<ts::cpu>()
                       .to_vector();
    int correct = 0;
    for (int i = 0; i < global; ++i) correct += b[static_cast<std::size_t>(i)] == labels[static_cast<std::size_t>(i)];
    std::printf("saved %s; the loaded model predicts %s; accuracy %.1f%%\n", path.c_str(),
                a == b ? "the same" : "differently", 100.0 * correct / global);
    std::filesystem::remove(path);
    if (a != b) status = 1;
    if (status) std::printf("FAILED: the loss did not fall enough or the ranks disagree\n");
  }
  return status;
}

int main() {
  dist::Session session;  // MPI up, this process bound to its device and its share of the cores
  dist::ProcessGroup world;
#if TESSERA_CUDA
  // NCCL needs a GPU of its own for every rank of the node; init made it current.
  int on_gpus = ts::cuda::device_count() >= dist::local_size() ? 1 : 0;
  auto agree = ts::from_vector<std::int32_t>({on_gpus}, {1});
  world.all_reduce(agree, ts::parallel::ReduceOp::min);  // every rank takes the same way
  if (agree.item() == 1) return train<ts::cuda>(world);
#endif
  return train<ts::cpu>(world);
}
