// examples/gpu_processes — one process per GPU, started the way training jobs are started:
//
//   torchrun --nproc-per-node 4 ./gpu_processes      (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT)
//   mpirun -np 4 ./gpu_processes                     (OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK, job id)
//
// process_communicator::from_env() joins the processes of this host and puts rank r on GPU
// r % (visible GPUs). Where every process has a GPU of its own it takes the device path: each call
// is one kernel launch on the stream and returns at once. The program all_reduces 1M floats (rank r
// contributes r + 1 in every element), checks the sum on every rank, and prints one line per rank.
// Exit status 0 when every element is right.
//
// The same source builds with nvcc (a GPU) and, as gpu_processes_emu, with the host compiler on
// braid's emulated CUDA device; tests/examples/gpu_processes.sh starts it as torchrun and mpirun would.
#include <braid/cuda.cuh>

#include <cstdio>
#include <vector>

int main() {
  try {
    auto comm = braid::cuda::process_communicator::from_env();
    const int r = comm.rank(), n = comm.size();
    BRAID_CUDA_CHECK(cudaSetDevice(comm.device()));
    cudaStream_t stream = nullptr;
    BRAID_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

    const std::size_t count = std::size_t{1} << 20;
    std::vector<float> host(count, static_cast<float>(r + 1));
    float* data = nullptr;
    BRAID_CUDA_CHECK(cudaMalloc(&data, count * sizeof(float)));
    BRAID_CUDA_CHECK(cudaMemcpyAsync(data, host.data(), count * sizeof(float), cudaMemcpyHostToDevice, stream));

    comm.all_reduce(data, data, count, braid::sum{}, stream); // in place; stream-ordered on the device path
    BRAID_CUDA_CHECK(cudaMemcpyAsync(host.data(), data, count * sizeof(float), cudaMemcpyDeviceToHost, stream));
    BRAID_CUDA_CHECK(cudaStreamSynchronize(stream));
    comm.check(); // what a kernel recorded (a timeout, a mismatch), if anything

    const float want = static_cast<float>(n * (n + 1) / 2);
    std::size_t wrong = 0;
    for (float v : host) wrong += v != want;
    std::printf("rank %d of %d on GPU %d, %s: %zu of %zu elements wrong\n", r, n, comm.device(), comm.describe().c_str(), wrong,
                count);
    BRAID_CUDA_CHECK(cudaFree(data));
    BRAID_CUDA_CHECK(cudaStreamDestroy(stream));
    return wrong == 0 ? 0 : 1;
  } catch (const braid::error& e) {
    std::fprintf(stderr, "gpu_processes: %s\n", e.what());
    return 2;
  }
}
