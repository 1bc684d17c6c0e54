// kiln_cuda_shim.h: runs the CUDA C that kiln-codegen emits on the CPU.
//
// Compile the generated kernels after this header as C++17 (see
// kiln_codegen::cuda::shim). What it maps:
//
// - `__global__` -> nothing (the kernels keep their `extern "C"`),
//   `__device__` -> `static inline`, `__forceinline__` -> nothing;
//   `__restrict__` is understood by gcc and clang as is.
// - `threadIdx`, `blockIdx`, `blockDim`, `gridDim`: thread_local dim3 values
//   set by the launcher for each emulated CUDA thread.
// - `__shared__` -> `static`: one copy per kernel; correct because the
//   launcher runs one block at a time (all its threads together).
// - `__syncthreads()` and the warp exchange of `__shfl_down_sync`: each CUDA
//   thread of a block is a fiber (ucontext) on the launching thread; a
//   barrier yields to the launcher, which resumes a block barrier's fibers
//   once every live fiber of the block waits there, and a warp barrier's once
//   every live lane of that warp does. Switching fibers costs far less than
//   waking pthreads (a reduction over many rows meets a dozen barriers per
//   row). A barrier that some live fibers never reach is reported as an
//   invalid launch (-2) rather than hanging.
// - `__shfl_down_sync(mask, v, off)`: a per-block exchange array (write own
//   slot, warp barrier, read lane + off, or own value when lane + off >= 32,
//   warp barrier). Every lane of a warp must call it, as on a GPU with a full
//   mask; it is per-warp, so a branch taken by whole warps (`if (warp == 0)`)
//   is fine.
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
#include <ucontext.h>
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
constexpr size_t kStack = 64 * 1024;

enum class Wait { Run, Warp, Block, Done };

struct Fiber {
  ucontext_t ctx;
  Wait wait;
};

inline unsigned long long shfl_slot[kMaxBlock];
inline std::mutex launch_mutex;
inline Fiber fibers[kMaxBlock];
inline std::vector<char> stacks;
inline ucontext_t launcher;
inline unsigned current = 0;
inline void (*call_body)(void*) = nullptr;
inline void* body_arg = nullptr;

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

// Parks the running fiber at a barrier of kind `w` and returns to the launcher.
inline void wait_at(Wait w) {
  fibers[current].wait = w;
  swapcontext(&fibers[current].ctx, &launcher);
}

inline void fiber_main() {
  call_body(body_arg);
  fibers[current].wait = Wait::Done;
  // uc_link returns to the launcher
}

// Releases the fibers waiting at a barrier every live member of their group
// has reached; false when no fiber can run (a barrier not all reach).
inline bool release(unsigned block) {
  bool all_block = true, any = false;
  for (unsigned t = 0; t < block; t++) {
    Wait w = fibers[t].wait;
    if (w == Wait::Run) return true;
    if (w != Wait::Done) any = true;
    if (w != Wait::Done && w != Wait::Block) all_block = false;
  }
  if (!any) return true;
  bool released = false;
  if (all_block) {
    for (unsigned t = 0; t < block; t++)
      if (fibers[t].wait == Wait::Block) fibers[t].wait = Wait::Run;
    return true;
  }
  for (unsigned w0 = 0; w0 < block; w0 += 32) {
    unsigned end = w0 + 32 < block ? w0 + 32 : block;
    bool warp = true, live = false;
    for (unsigned t = w0; t < end; t++) {
      if (fibers[t].wait == Wait::Done) continue;
      live = true;
      if (fibers[t].wait != Wait::Warp) warp = false;
    }
    if (warp && live) {
      for (unsigned t = w0; t < end; t++)
        if (fibers[t].wait == Wait::Warp) fibers[t].wait = Wait::Run;
      released = true;
    }
  }
  return released;
}

// Runs one block's threads as fibers until all return; -2 on a barrier deadlock.
inline int run_block(unsigned grid, unsigned block, unsigned b) {
  if (stacks.size() < (size_t)block * kStack) stacks.resize((size_t)block * kStack);
  for (unsigned t = 0; t < block; t++) {
    getcontext(&fibers[t].ctx);
    fibers[t].ctx.uc_stack.ss_sp = stacks.data() + (size_t)t * kStack;
    fibers[t].ctx.uc_stack.ss_size = kStack;
    fibers[t].ctx.uc_link = &launcher;
    makecontext(&fibers[t].ctx, fiber_main, 0);
    fibers[t].wait = Wait::Run;
  }
  for (;;) {
    bool live = false;
    for (unsigned t = 0; t < block; t++) {
      if (fibers[t].wait == Wait::Run) {
        current = t;
        set_ids(grid, block, b, t);
        swapcontext(&launcher, &fibers[t].ctx);
      }
      if (fibers[t].wait != Wait::Done) live = true;
    }
    if (!live) return 0;
    if (!release(block)) return -2;
  }
}

// Runs `body` for every (block, thread) of a 1-D launch. Returns 0, -1 for an
// invalid launch shape, -2 for a barrier some threads never reach.
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
  call_body = [](void* f) { (*static_cast<F*>(f))(); };
  body_arg = &body;
  for (unsigned b = 0; b < grid; b++) {
    int rc = run_block(grid, block, b);
    if (rc != 0) return rc;
  }
  return 0;
}

}  // namespace kiln_shim

static inline void __syncthreads() { kiln_shim::wait_at(kiln_shim::Wait::Block); }

template <class T>
static inline T __shfl_down_sync(unsigned /*mask*/, T v, int off) {
  static_assert(sizeof(T) <= sizeof(unsigned long long), "shuffle of a wide type");
  const unsigned tid = threadIdx.x;
  const unsigned lane = tid & 31u;
  std::memcpy(&kiln_shim::shfl_slot[tid], &v, sizeof(T));
  kiln_shim::wait_at(kiln_shim::Wait::Warp);
  T r = v;
  const unsigned src = tid + (unsigned)off;
  if (off >= 0 && lane + (unsigned)off < 32u && src < blockDim.x)
    std::memcpy(&r, &kiln_shim::shfl_slot[src], sizeof(T));
  kiln_shim::wait_at(kiln_shim::Wait::Warp);
  return r;
}
