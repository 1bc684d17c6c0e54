// kiln_cuda_shim.h: runs the CUDA C that kiln-codegen emits on the CPU.
//
// Compile the generated kernels after this header as C++17 with -pthread
// (see codegen/tests/cuda_shim.rs). What it maps:
//
// - `__global__` -> nothing (the kernels keep their `extern "C"`),
//   `__device__` -> `static inline`, `__forceinline__` -> nothing;
//   `__restrict__` is understood by gcc and clang as is.
// - `threadIdx`, `blockIdx`, `blockDim`, `gridDim`: thread_local dim3 values
//   set by the launcher for each emulated CUDA thread.
// - `__shared__` -> `static`: one copy per kernel; correct because the
//   launcher runs one block at a time (all its threads together).
// - `__syncthreads()`: a pthread barrier over the block's threads (one
//   pthread per CUDA thread, created once per launch; each thread walks the
//   grid's blocks in order, with a barrier between blocks).
// - `__shfl_down_sync(mask, v, off)`: a per-warp exchange array and a
//   per-warp barrier (write own slot, barrier, read lane + off, or own value
//   when lane + off >= 32, barrier). Every lane of a warp must call it, as on
//   a GPU with a full mask; it is per-warp, so a branch taken by whole warps
//   (`if (warp == 0)`) is fine.
// - Math: <cmath> (`expf`, `erff`, `isnan`, ...) - glibc's, not libdevice,
//   so results differ from a GPU by a few ulp; `__int_as_float` and friends
//   by memcpy.
//
// Kernels without `__syncthreads` run serially (every block, every thread,
// one after the other), which is valid for grid-stride loops.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <math.h>
#include <mutex>
#include <pthread.h>
#include <thread>
#include <vector>

using std::isinf;
using std::isnan;

struct dim3 {
  unsigned int x, y, z;
};

inline thread_local dim3 threadIdx = {0, 0, 0};
inline thread_local dim3 blockIdx = {0, 0, 0};
inline thread_local dim3 blockDim = {1, 1, 1};
inline thread_local dim3 gridDim = {1, 1, 1};

#define __global__
#define __device__ static inline
#define __forceinline__
#define __host__
#define __shared__ static

static inline float __int_as_float(int x) {
  float f;
  std::memcpy(&f, &x, sizeof f);
  return f;
}
static inline int __float_as_int(float x) {
  int i;
  std::memcpy(&i, &x, sizeof i);
  return i;
}
static inline double __longlong_as_double(long long x) {
  double f;
  std::memcpy(&f, &x, sizeof f);
  return f;
}
static inline long long __double_as_longlong(double x) {
  long long i;
  std::memcpy(&i, &x, sizeof i);
  return i;
}

namespace kiln_shim {

constexpr unsigned kMaxBlock = 1024;

inline pthread_barrier_t block_barrier;
inline pthread_barrier_t warp_barrier[kMaxBlock / 32];
inline unsigned long long shfl_slot[kMaxBlock];
inline std::mutex launch_mutex;

inline double f64_of_bits(unsigned long long b) {
  double d;
  std::memcpy(&d, &b, sizeof d);
  return d;
}

inline void set_ids(unsigned grid, unsigned block, unsigned b, unsigned t) {
  threadIdx = {t, 0, 0};
  blockIdx = {b, 0, 0};
  blockDim = {block, 1, 1};
  gridDim = {grid, 1, 1};
}

// Runs `body` for every (block, thread) of a 1-D launch. Returns 0, or -1
// for an invalid launch shape.
template <class F>
int launch(unsigned grid, unsigned block, bool sync, F body) {
  if (grid == 0 || block == 0 || block > kMaxBlock) return -1;
  std::lock_guard<std::mutex> g(launch_mutex);
  if (!sync) {
    for (unsigned b = 0; b < grid; b++)
      for (unsigned t = 0; t < block; t++) {
        set_ids(grid, block, b, t);
        body();
      }
    return 0;
  }
  const unsigned nwarps = (block + 31) / 32;
  pthread_barrier_init(&block_barrier, nullptr, block);
  for (unsigned w = 0; w < nwarps; w++) {
    unsigned n = block - 32 * w < 32 ? block - 32 * w : 32;
    pthread_barrier_init(&warp_barrier[w], nullptr, n);
  }
  std::vector<std::thread> threads;
  threads.reserve(block);
  for (unsigned t = 0; t < block; t++) {
    threads.emplace_back([=, &body] {
      for (unsigned b = 0; b < grid; b++) {
        set_ids(grid, block, b, t);
        body();
        // `__shared__` statics are reused by the next block.
        pthread_barrier_wait(&block_barrier);
      }
    });
  }
  for (auto& th : threads) th.join();
  for (unsigned w = 0; w < nwarps; w++) pthread_barrier_destroy(&warp_barrier[w]);
  pthread_barrier_destroy(&block_barrier);
  return 0;
}

}  // namespace kiln_shim

static inline void __syncthreads() { pthread_barrier_wait(&kiln_shim::block_barrier); }

template <class T>
static inline T __shfl_down_sync(unsigned /*mask*/, T v, int off) {
  static_assert(sizeof(T) <= sizeof(unsigned long long), "shuffle of a wide type");
  const unsigned tid = threadIdx.x;
  const unsigned lane = tid & 31u;
  pthread_barrier_t* bar = &kiln_shim::warp_barrier[tid >> 5];
  std::memcpy(&kiln_shim::shfl_slot[tid], &v, sizeof(T));
  pthread_barrier_wait(bar);
  T r = v;
  const unsigned src = tid + (unsigned)off;
  if (off >= 0 && lane + (unsigned)off < 32u && src < blockDim.x)
    std::memcpy(&r, &kiln_shim::shfl_slot[src], sizeof(T));
  pthread_barrier_wait(bar);
  return r;
}
