#include <braid/braid.hpp>
#include <span>
#include <vector>
int main() {
  std::vector<float> result;
  braid::run_threads(2, [&](braid::communicator& comm) {
    std::vector<float> v{1.0f * comm.rank(), 2.0f};
    comm.all_reduce(std::span<float>(v), braid::sum{});
    if (comm.rank() == 0) result = v;
  });
  return (result.size() == 2 && result[0] == 1.0f && result[1] == 4.0f) ? 0 : 1;
}
