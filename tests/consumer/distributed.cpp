// A user's program with one process per device (tessera::distributed), run under mpirun: every
// rank adds its rank + 1, and each must hold 1 + 2 + ... + size.
#include <tessera/distributed.hpp>
#include <tessera/tessera.hpp>

#include <cstdio>

namespace ts = tessera;
namespace dist = tessera::distributed;

int main() {
  dist::Session session;
  dist::ProcessGroup world;
  const int rank = world.rank(), size = world.size();
  auto t = ts::from_vector<float>({static_cast<float>(rank + 1)}, {1});
  world.all_reduce(t);
  const float expected = static_cast<float>(size * (size + 1) / 2);
  std::printf("consumer_distributed: rank %d of %d holds %g (expected %g)\n", rank, size, t.item(),
              expected);
  return t.item() == expected ? 0 : 1;
}
