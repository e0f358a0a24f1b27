/*
 * plover_kernel.h — write a kernel once, build it for both targets.
 *
 *   nvcc -x cu    -shared -Xcompiler -fPIC            ->  CUDA bundle
 *   g++  -x c++ -std=c++17 -shared -fPIC -O2          ->  host bundle
 *
 * The host target needs C++17 (g++ 8 or later). Write device code with
 * __global__/__device__, threadIdx, blockIdx, blockDim, gridDim (x, y, z),
 * __shared__, __syncthreads() and atomics, and launch with
 *
 *     PLOVER_LAUNCH(kernel, grid, block, s, args...);
 *     PLOVER_LAUNCH_SHARED(kernel, grid, block, shared_bytes, s, args...);
 *
 * which are kernel<<<grid, block, 0 or shared_bytes, s->stream>>>(args...)
 * under nvcc. grid and block are integers or dim3 (dim3 b(16, 16);). A kernel
 * gets its dynamic shared memory with PLOVER_DYNAMIC_SHARED(float, buf); which
 * declares float *buf (under nvcc over extern __shared__ memory, so any
 * number of kernels may use it with any types; extern __shared__ itself
 * does not compile on the host target).
 *
 * HOST TARGET: a simulator of a GPU that runs one block at a time.
 *   - A launch runs its blocks one after another on the calling thread, and
 *     a block's threads as cooperating fibers switched only at barriers, so
 *     threads that share data through __shared__ memory and __syncthreads()
 *     compute what they compute on a GPU.
 *   - __syncthreads() waits for every thread of the block that has not
 *     returned (a returned thread counts as arrived); so do
 *     __syncthreads_count/_and/_or(pred), which return CUDA's values.
 *   - __shared__ memory is per OS thread, so every running block has its
 *     own and two instances may run at once on two threads. As on a GPU,
 *     its contents at block start are undefined (here: the last block's).
 *     A launch's dynamic shared memory ends, rounded up to 16 bytes, at an
 *     inaccessible page: an access past the shared_bytes it asked for
 *     faults (SIGSEGV) at the access, an illegal access on a GPU.
 *   - atomicAdd/Sub/Exch/Min/Max/Inc/Dec/CAS/And/Or/Xor have CUDA's
 *     overloads (int, unsigned, unsigned long long; float and double add)
 *     and return the old value. They are plain read-modify-writes, exact
 *     because one thread runs at a time; so a __device__ variable is not
 *     protected from another instance running at the same time.
 *   - Checked like a GPU launch, failing the request (plover_fail) instead:
 *     a block of 0 or over 1024 threads (z <= 64), a grid of 0 blocks or y
 *     or z over 65535, dynamic shared memory over 48 KiB (#define
 *     PLOVER_MAX_DYNAMIC_SHARED_BYTES to match a cudaFuncSetAttribute), a
 *     launch from a kernel, and barrier divergence, undefined on a GPU
 *     (often a hang or wrong results): a __syncthreads() (or _count, _and,
 *     _or) that not every thread of the block reaches, whether some skip
 *     it in a conditional (they return, or reach another barrier, while
 *     the others wait at this one) or returned before it. The message
 *     names the kernel, the block, the barrier's file and line, and a
 *     thread that did not reach it. Barriers are told apart by file and
 *     line alone: two on one line, or one in a __device__ function that
 *     divergent branches both call, count as one, and threads meeting at
 *     different ones of them are not reported.
 *   - A kernel must not throw (CUDA device code cannot): an exception out
 *     of a kernel ends the process (std::terminate), whatever catches
 *     around the launch.
 *   - Also there: __threadfence/_block (compiler barriers only), __ldg,
 *     __float_as_int and the other bit casts, __launch_bounds__ (ignored).
 *   - NOT SUPPORTED (compile errors on the host target): warp intrinsics
 *     (__shfl*, __ballot*, __any/__all*, __syncwarp, warpSize), cooperative
 *     groups, __constant__ and texture memory. Code relying on
 *     warp-synchronous execution is wrong on both targets.
 *
 * COST, host target. Thread 0 of each block runs as a plain call; if it
 * returns without reaching __syncthreads, so do the block's other threads:
 * a kernel without barriers costs what ABI 1's serial loop cost, within
 * about 10% (a one-float vecadd: 0.35 ns a thread). If thread 0 reaches a
 * barrier the block runs as fibers: about 60 ns more per thread, and 10-35
 * ns per thread per barrier (a context switch; x86-64, 2-core VM:
 * BenchmarkSim in device/sim_test.go, samples/softmax).
 * The switch is hand-written for x86-64; elsewhere, or with
 * PLOVER_FIBER_UCONTEXT defined, it is swapcontext, which makes system
 * calls: microseconds per switch. Threads run one after another, so a
 * grid-stride loop walks memory with a stride of grid*block: launch one
 * element per thread where you can (vecadd: 3x faster).
 *
 * STACKS, host target. Thread 0 runs on the caller's stack, as do all the
 * threads of a block without barriers. The other threads of a fiber block
 * run on stacks of PLOVER_FIBER_STACK_BYTES (default 64 KiB; #define it
 * before the include for large locals) above a guard page, so an overflow
 * faults (SIGSEGV) instead of corrupting memory. An OS thread keeps its
 * stacks, one per thread of the largest fiber block it ran (two memory
 * mappings each), until the bundle is unloaded.
 *
 * PLOVER_TARGET is "cuda" under nvcc and "host" otherwise, so a portable
 * bundle declares itself with PLOVER_BUNDLE(PLOVER_TARGET).
 */
#ifndef PLOVER_KERNEL_H
#define PLOVER_KERNEL_H

#include "plover.h"

#ifdef __CUDACC__

#define PLOVER_TARGET "cuda"

#define PLOVER_LAUNCH(kernel, grid, block, s, ...) \
  kernel<<<(grid), (block), 0, (cudaStream_t)((s)->stream)>>>(__VA_ARGS__)

#define PLOVER_LAUNCH_SHARED(kernel, grid, block, shared_bytes, s, ...) \
  kernel<<<(grid), (block), (shared_bytes), (cudaStream_t)((s)->stream)>>>(__VA_ARGS__)

#define PLOVER_DYNAMIC_SHARED(type, name)                                    \
  extern __shared__ __align__(16) unsigned char plover_dynamic_shared_[];  \
  type *const name = reinterpret_cast<type *>(plover_dynamic_shared_)

#else /* host target */

#if !defined(__cplusplus) || __cplusplus < 201703L
#error "plover_kernel.h: the host target is C++17: build with g++ -x c++ -std=c++17"
#endif

#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <tuple>
#include <type_traits>
#include <utility>

#if !defined(__x86_64__) || defined(PLOVER_FIBER_UCONTEXT)
#include <ucontext.h>
#define PLOVER_FIBER_UCONTEXT_ 1
#endif

#ifndef PLOVER_FIBER_STACK_BYTES
#define PLOVER_FIBER_STACK_BYTES 65536
#endif
#ifndef PLOVER_MAX_DYNAMIC_SHARED_BYTES
#define PLOVER_MAX_DYNAMIC_SHARED_BYTES 49152
#endif

#define PLOVER_TARGET "host"

#define __global__ static
#define __device__ static inline
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __restrict__ __restrict
#define __launch_bounds__(...)
/* Per OS thread, which is per running block: blocks run one at a time. */
#define __shared__ static thread_local

struct uint3 {
  unsigned int x, y, z;
};

struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
      : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return uint3{x, y, z}; }
};

/* Set by the launch; per OS thread (and per source file). */
[[maybe_unused]] static thread_local uint3 threadIdx, blockIdx;
[[maybe_unused]] static thread_local dim3 blockDim, gridDim;

/* Everything below has internal linkage: a bundle of several source files
 * gets one copy per file and exports nothing. */
namespace plover_sim_ {
namespace {

enum Mode {
  IDLE,   /* no launch */
  SOLO,   /* a block of one thread: barriers are no-ops */
  PROBE,  /* thread 0 runs directly; no barrier yet */
  DIRECT, /* thread 0 returned without a barrier: the others run directly */
  FIBERS, /* thread 0 reached a barrier: the block runs as fibers */
  BROKEN  /* no stacks for the fibers: stop after thread 0 */
};

#ifdef PLOVER_FIBER_UCONTEXT_
struct Ctx {
  ucontext_t uc;
};
#else
struct Ctx {
  void *sp;
};
#endif

/* A thread of a block in fiber mode. Thread 0 runs on the
 * launching code's stack and has no mapping of its own. */
struct Fiber {
  Ctx ctx;
  char *map; /* guard page, then the stack; NULL until needed */
  uint3 idx; /* threadIdx while it runs */
  bool done; /* returned from the kernel */
};

/* An OS thread's fibers and dynamic shared memory. Heap memory listed in
 * pools_, so that unloading the bundle frees every thread's: a thread_local
 * with a destructor would keep a dlclosed bundle mapped until the thread
 * exits, and an exited thread's thread_local memory is gone. */
struct Pool {
  Fiber *fibers;   /* one per thread of the largest block run here */
  unsigned cap;    /* records in fibers */
  unsigned mapped; /* fibers[1..mapped) have stacks */
  char *dyn;       /* dynamic shared memory: dyncap bytes, then a guard page */
  size_t dyncap;
  bool busy;
  Pool *next;
};

/* The simulator's per-OS-thread state. Trivial, so accesses are direct. */
struct State {
  Mode mode;
  Fiber *cur; /* the thread running, in fiber mode */
  void (*body)(void *);
  void *arg;
  unsigned nthreads;
  unsigned started, live;          /* fiber mode: threads started, not returned */
  uint64_t fpctl;                  /* fiber mode: thread 0's control words */
  unsigned acc, arrived;           /* the barrier being reached */
  unsigned res_count, res_arrived; /* the last completed barrier */
  const char *site;                /* that barrier's file:line */
  bool returned;                   /* a thread returned in this round */
  bool diverged;
  const char *kernel; /* the launch's kernel, for messages */
  void *dyn; /* this launch's dynamic shared memory */
  Pool *pool;
};

[[maybe_unused]] thread_local State st;
[[maybe_unused]] Pool *pools_;
[[maybe_unused]] char pools_lock_;
[[maybe_unused]] size_t page_bytes_;

inline size_t page_bytes() {
  if (page_bytes_ == 0) page_bytes_ = (size_t)sysconf(_SC_PAGESIZE); /* same value on every thread */
  return page_bytes_;
}

inline size_t stack_bytes() {
  size_t p = page_bytes();
  return ((size_t)(PLOVER_FIBER_STACK_BYTES) + p - 1) / p * p;
}

inline void lock_pools() {
  while (__atomic_test_and_set(&pools_lock_, __ATOMIC_ACQUIRE)) {
  }
}
inline void unlock_pools() { __atomic_clear(&pools_lock_, __ATOMIC_RELEASE); }

/* Frees the pools when the bundle is unloaded; no kernel runs then. */
inline __attribute__((destructor)) void unload_() {
  lock_pools();
  for (Pool *p = pools_, *next; p != nullptr; p = next) {
    next = p->next;
    if (p->busy) continue; /* exit() while a kernel runs: leave it */
    for (unsigned i = 1; i < p->mapped; i++) munmap(p->fibers[i].map, page_bytes() + stack_bytes());
    free(p->fibers);
    if (p->dyn != nullptr) munmap(p->dyn, p->dyncap + page_bytes());
    free(p);
  }
  pools_ = nullptr;
  unlock_pools();
}

[[noreturn]] inline void fiber_main() noexcept;

#ifdef PLOVER_FIBER_UCONTEXT_

inline uint64_t fp_control() { return 0; }

inline void ctx_switch(Ctx *save, Ctx *to) { swapcontext(&save->uc, &to->uc); }

inline void ctx_make(Fiber *f, uint64_t /*fpctl*/, size_t color) {
  getcontext(&f->ctx.uc); /* with the current floating-point state */
  f->ctx.uc.uc_stack.ss_sp = f->map + page_bytes();
  f->ctx.uc.uc_stack.ss_size = stack_bytes() - color;
  f->ctx.uc.uc_link = nullptr;
  makecontext(&f->ctx.uc, (void (*)())fiber_main, 0);
}

#else

/* Saves the callee-saved registers, MXCSR and the x87 control word on the
 * current stack and the stack pointer in *save, then resumes the context
 * saved at `to` (or made by ctx_make). The control words are loaded only
 * when they differ: loading them stalls the pipeline. */
inline __attribute__((naked, noinline)) void ctx_swap(void ** /*save*/, void * /*to*/) {
  __asm__(
      "pushq %rbp\n\t"
      "pushq %rbx\n\t"
      "pushq %r12\n\t"
      "pushq %r13\n\t"
      "pushq %r14\n\t"
      "pushq %r15\n\t"
      "subq $8, %rsp\n\t"
      "fnstcw (%rsp)\n\t"
      "stmxcsr 4(%rsp)\n\t"
      "movzwl (%rsp), %eax\n\t" /* the sizes stored: no forwarding stall */
      "movl 4(%rsp), %ecx\n\t"
      "movq %rsp, (%rdi)\n\t"
      "movq %rsi, %rsp\n\t"
      "cmpw (%rsp), %ax\n\t"
      "je 1f\n\t"
      "fldcw (%rsp)\n"
      "1:\n\t"
      "cmpl 4(%rsp), %ecx\n\t"
      "je 2f\n\t"
      "ldmxcsr 4(%rsp)\n"
      "2:\n\t"
      "addq $8, %rsp\n\t"
      "popq %r15\n\t"
      "popq %r14\n\t"
      "popq %r13\n\t"
      "popq %r12\n\t"
      "popq %rbx\n\t"
      "popq %rbp\n\t"
      "ret\n\t");
}

inline void ctx_switch(Ctx *save, Ctx *to) {
  __asm__ volatile("" ::: "memory");
  ctx_swap(&save->sp, to->sp);
  __asm__ volatile("" ::: "memory");
}

/* The floating-point control words as ctx_swap saves them. */
inline uint64_t fp_control() {
  uint16_t cw;
  uint32_t mxcsr;
  __asm__ volatile("fnstcw %0" : "=m"(cw));
  __asm__ volatile("stmxcsr %0" : "=m"(mxcsr));
  return (uint64_t)cw | (uint64_t)mxcsr << 32;
}

/* A frame that ctx_swap "returns" from into fiber_main, with control words
 * fpctl. */
inline void ctx_make(Fiber *f, uint64_t fpctl, size_t color) {
  uintptr_t top = (uintptr_t)(f->map + page_bytes() + stack_bytes() - color) & ~(uintptr_t)15;
  uint64_t *ret = (uint64_t *)(top - 16); /* 16-aligned, as after a call */
  ret[1] = 0; /* fiber_main's return address: it never returns */
  ret[0] = (uint64_t)(uintptr_t)&fiber_main;
  uint64_t *sp = ret - 7; /* control words, r15, r14, r13, r12, rbx, rbp */
  sp[0] = fpctl;
  for (int i = 1; i < 7; i++) sp[i] = 0;
  f->ctx.sp = sp;
}

#endif

/* A divergence's message, read by the runtime after the chain: the first
 * of a launch (a second launch of the same run that diverges rewrites it). */
[[maybe_unused]] thread_local char diverge_msg_[512];

inline const char *base_name(const char *path) {
  const char *b = path;
  for (const char *p = path; *p; p++)
    if (*p == '/') b = p + 1;
  return b;
}

/* The shapes of barrier divergence the simulator tells apart. */
enum Diverge { RETURNED, OTHER_BARRIER, AFTER_RETURN, THREAD0_RETURNED };

/* Reports barrier divergence in the current block, once per launch: the
 * thread now running (threadIdx) did not keep step with the others at
 * site (other: the barrier it reached instead, for OTHER_BARRIER). */
inline __attribute__((noinline, cold)) void diverged(State &s, Diverge how, const char *site, const char *other) {
  if (s.diverged) return;
  s.diverged = true;
  char what[256];
  site = site ? base_name(site) : "?";
  switch (how) {
    case RETURNED:
      snprintf(what, sizeof what, "returned while other threads wait at __syncthreads() at %s", site);
      break;
    case OTHER_BARRIER:
      snprintf(what, sizeof what, "reached __syncthreads() at %s while other threads wait at the one at %s",
               other ? base_name(other) : "?", site);
      break;
    case AFTER_RETURN:
      snprintf(what, sizeof what, "reached __syncthreads() at %s after other threads returned without reaching it",
               site);
      break;
    case THREAD0_RETURNED:
      snprintf(what, sizeof what, "reached __syncthreads() at %s, which thread 0 returned without reaching", site);
      break;
  }
  snprintf(diverge_msg_, sizeof diverge_msg_,
           "plover_kernel.h: barrier divergence in kernel %s, block (%u,%u,%u): thread (%u,%u,%u) %s "
           "(undefined on a GPU, often a hang or wrong results: every thread of a block must reach "
           "the same __syncthreads() calls)",
           s.kernel ? s.kernel : "?", blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x, threadIdx.y, threadIdx.z,
           what);
  plover_set_error_(diverge_msg_);
}

/* Fiber mode. A block's threads run in rounds, in thread order: each runs
 * to its next barrier or its return, then switches straight to the next
 * live thread (starting it in the first round). A round ends with every
 * live thread at the same barrier, which then completes. Thread 0 runs on
 * the launching code's stack; when the last thread returns, that code
 * (finish_block) resumes.
 *
 * run_next leaves thread self (at a barrier, or returned) for the next one
 * to run; it returns when self is resumed, at once if no other is live. */
inline void run_next(State &s, Fiber *self) {
  Fiber *fs = s.pool->fibers;
  const unsigned n = s.nthreads;
  unsigned t = (unsigned)(self - fs);
  for (;;) {
    if (++t == n) { /* every live thread is at the barrier */
      t = 0;
      s.res_count = s.acc;
      s.res_arrived = s.arrived;
      s.acc = s.arrived = 0;
      s.site = nullptr;
      s.returned = false;
    }
    Fiber *f = &fs[t];
    if (t == s.started) { /* the first round: start it */
      s.started++;
      /* Stack tops at different cache sets: the stacks are page-aligned,
       * so their hot lines would otherwise share a few sets. */
      ctx_make(f, s.fpctl, (t % 64) * 64);
      f->done = false;
      uint3 i = fs[t - 1].idx; /* the next index after thread t-1's */
      if (++i.x == blockDim.x) {
        i.x = 0;
        if (++i.y == blockDim.y) i.y = 0, i.z++;
      }
      f->idx = i;
    } else if (f->done) {
      continue;
    } else if (f == self) {
      return;
    }
    threadIdx = f->idx;
    s.cur = f;
    ctx_switch(&self->ctx, &f->ctx);
    return;
  }
}

/* A returned thread: on to the next, or back to the launching code. */
[[noreturn]] inline void thread_done(State &s, Fiber *self) {
  self->done = true;
  if (s.arrived > 0) diverged(s, RETURNED, s.site, nullptr);
  s.returned = true;
  if (--s.live == 0)
    ctx_switch(&self->ctx, &s.pool->fibers[0].ctx);
  else
    run_next(s, self);
  __builtin_trap(); /* a returned thread is never resumed */
}

inline void fiber_main() noexcept {
  State &s = st;
  s.body(s.arg);
  thread_done(s, s.cur);
}

inline bool map_stack(Fiber *f) {
  size_t guard = page_bytes(), len = guard + stack_bytes();
  void *m = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
  if (m == MAP_FAILED) return false;
  if (mprotect(m, guard, PROT_NONE) != 0) {
    munmap(m, len);
    return false;
  }
  f->map = (char *)m;
  return true;
}

/* Thread 0 reached its first barrier: the block goes to fiber mode. */
inline __attribute__((noinline)) void enter_fibers(State &s, unsigned pred, const char *site) {
  Pool *p = s.pool;
  for (; p->mapped < s.nthreads; p->mapped++)
    if (!map_stack(&p->fibers[p->mapped])) {
      s.mode = BROKEN;
      plover_set_error_("plover_kernel.h: cannot allocate fiber stacks (out of memory or of memory mappings)");
      return;
    }
  Fiber *f0 = &p->fibers[0];
  s.mode = FIBERS;
  s.fpctl = fp_control();
  s.acc = pred;
  s.arrived = 1;
  s.site = site;
  s.returned = false;
  s.started = 1;
  s.live = s.nthreads;
  s.cur = f0;
  f0->done = false;
  f0->idx = uint3{0, 0, 0};
  run_next(s, f0);
}

/* Thread 0 returned in fiber mode: run the others until all have returned. */
inline __attribute__((noinline)) void finish_block(State &s) {
  Fiber *f0 = &s.pool->fibers[0];
  f0->done = true;
  s.returned = true; /* first in its round: no other thread waits yet */
  if (--s.live > 0) run_next(s, f0); /* resumed by the last thread_done */
}

/* __syncthreads and friends, outside the fast path; site is the barrier's
 * file:line. */
inline __attribute__((noinline)) void barrier(unsigned pred, const char *site) {
  State &s = st;
  switch (s.mode) {
    case FIBERS:
      if (s.arrived == 0)
        s.site = site;
      else if (site != s.site && strcmp(site, s.site) != 0)
        diverged(s, OTHER_BARRIER, s.site, site);
      if (s.returned) diverged(s, AFTER_RETURN, site, nullptr);
      s.acc += pred;
      s.arrived++;
      run_next(s, s.cur);
      return;
    case PROBE:
      enter_fibers(s, pred, site);
      return;
    case DIRECT:
      diverged(s, THREAD0_RETURNED, site, nullptr);
      break;
    case IDLE:
    case SOLO:
    case BROKEN:
      break;
  }
  s.res_count = pred;
  s.res_arrived = 1;
}

inline Pool *new_pool() {
  Pool *p = (Pool *)calloc(1, sizeof(Pool));
  if (p == nullptr) return nullptr;
  p->mapped = 1;
  lock_pools();
  p->next = pools_;
  pools_ = p;
  unlock_pools();
  return p;
}

/* Checks the launch like a GPU and readies the state; false (error set) to
 * skip it. */
inline __attribute__((noinline)) bool begin(State &s, dim3 g, dim3 b, size_t shared, void (*body)(void *), void *arg) {
  if (s.mode != IDLE) {
    plover_set_error_("plover_kernel.h: kernel launched from inside a kernel (not supported on the host target)");
    return false;
  }
  if (b.x == 0 || b.y == 0 || b.z == 0 || b.x > 1024 || b.y > 1024 || b.z > 64 || (uint64_t)b.x * b.y * b.z > 1024 ||
      g.x == 0 || g.y == 0 || g.z == 0 || g.x > 0x7fffffffu || g.y > 65535 || g.z > 65535) {
    plover_set_error_(
        "plover_kernel.h: invalid launch configuration (cudaErrorInvalidConfiguration): a block "
        "has 1..1024 threads with z <= 64; a grid has x >= 1, 1 <= y, z <= 65535");
    return false;
  }
  if (shared > (size_t)(PLOVER_MAX_DYNAMIC_SHARED_BYTES)) {
    plover_set_error_(
        "plover_kernel.h: dynamic shared memory over PLOVER_MAX_DYNAMIC_SHARED_BYTES (48 KiB "
        "unless raised, as on a GPU without cudaFuncSetAttribute)");
    return false;
  }
  if (s.pool == nullptr && (s.pool = new_pool()) == nullptr) goto oom;
  {
    Pool *p = s.pool;
    unsigned n = b.x * b.y * b.z;
    if (n > p->cap) { /* records only: stacks are mapped at the first barrier */
      Fiber *f = (Fiber *)realloc(p->fibers, n * sizeof(Fiber));
      if (f == nullptr) goto oom;
      memset((void *)(f + p->cap), 0, (n - p->cap) * sizeof(Fiber));
      p->fibers = f;
      p->cap = n;
    }
    if (shared > p->dyncap) { /* pages, then an inaccessible one */
      size_t pg = page_bytes(), cap = (shared + pg - 1) / pg * pg;
      void *m = mmap(nullptr, cap + pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (m == MAP_FAILED) goto oom;
      if (mprotect((char *)m + cap, pg, PROT_NONE) != 0) {
        munmap(m, cap + pg);
        goto oom;
      }
      if (p->dyn != nullptr) munmap(p->dyn, p->dyncap + pg);
      p->dyn = (char *)m;
      p->dyncap = cap;
    }
    p->busy = true;
    /* This launch's memory ends at the guard, to CUDA's 16-byte alignment:
     * an access past it faults there. */
    s.dyn = p->dyn != nullptr ? p->dyn + p->dyncap - (shared + 15) / 16 * 16 : nullptr;
    s.body = body;
    s.arg = arg;
    s.nthreads = n;
    s.diverged = false;
    s.site = nullptr;
    s.returned = false;
    gridDim = g;
    blockDim = b;
    return true;
  }
oom:
  plover_set_error_("plover_kernel.h: out of memory");
  return false;
}

template <class F>
inline void invoke(void *f) {
  (*(const F *)f)();
}

/* One launch: body() runs one thread at threadIdx/blockIdx. Thread 0 of
 * each block runs first, directly; if it returns without reaching a barrier
 * the others run directly too (the fast path), else the block has run as
 * fibers by the time finish_block returns. Flattened, so the kernel is
 * inlined into the loops, and with the index variables themselves as loop
 * counters, as in ABI 1's serial loop: the kernel keeps the registers.
 * noexcept: a kernel's exception ends the process (std::terminate) here as
 * in a fiber (fiber_main); let out of a launch, one an entry caught would
 * skip the reset below and wedge this OS thread's simulator. */
template <class F>
__attribute__((flatten)) inline void run(dim3 g, dim3 b, size_t shared, const F &fibers_body) noexcept {
  if (!begin(st, g, b, shared, &invoke<F>, (void *)&fibers_body)) return;
  /* A copy whose address stays here, so the compiler may keep the
   * arguments in registers. */
  const F body = fibers_body;
  if (st.nthreads == 1) { /* blocks of one thread: barriers are no-ops */
    st.mode = SOLO;
    threadIdx = uint3{0, 0, 0};
    for (blockIdx.z = 0; blockIdx.z < gridDim.z; blockIdx.z++)
      for (blockIdx.y = 0; blockIdx.y < gridDim.y; blockIdx.y++)
        for (blockIdx.x = 0; blockIdx.x < gridDim.x; blockIdx.x++) body();
    goto out;
  }
  for (blockIdx.z = 0; blockIdx.z < gridDim.z; blockIdx.z++)
    for (blockIdx.y = 0; blockIdx.y < gridDim.y; blockIdx.y++)
      for (blockIdx.x = 0; blockIdx.x < gridDim.x; blockIdx.x++) {
        threadIdx = uint3{0, 0, 0};
        st.mode = PROBE;
        body();
        if (st.mode != PROBE) { /* thread 0 reached a barrier */
          if (st.mode == BROKEN) goto out;
          finish_block(st); /* the others run as fibers */
          continue;
        }
        st.mode = DIRECT;
        for (threadIdx.z = 0; threadIdx.z < blockDim.z; threadIdx.z++)
          for (threadIdx.y = 0; threadIdx.y < blockDim.y; threadIdx.y++)
            for (threadIdx.x = threadIdx.y == 0 && threadIdx.z == 0; threadIdx.x < blockDim.x; threadIdx.x++)
              body();
      }
out:
  st.mode = IDLE;
  st.pool->busy = false;
}

template <class K>
struct Launcher {
  dim3 grid, block;
  size_t shared;
  K kernel;
  const char *name;
  template <class... A>
  void operator()(A &&...a) {
    /* Arguments are evaluated once, as for <<< >>>, and held by value. */
    auto body = [k = kernel, args = std::tuple<std::decay_t<A>...>(std::forward<A>(a)...)]() {
      std::apply(k, args);
    };
    st.kernel = name;
    run(grid, block, shared, body);
  }
};

template <class K>
inline Launcher<K> launcher(dim3 grid, dim3 block, size_t shared, K kernel, const char *name) {
  return Launcher<K>{grid, block, shared, kernel, name};
}

} /* namespace */
} /* namespace plover_sim_ */

#define PLOVER_LAUNCH(kernel, grid, block, s, ...) \
  PLOVER_LAUNCH_SHARED(kernel, grid, block, 0, s, __VA_ARGS__)

#define PLOVER_LAUNCH_SHARED(kernel, grid, block, shared_bytes, s, ...)              \
  ((void)(s), ::plover_sim_::launcher(::dim3(grid), ::dim3(block), (size_t)(shared_bytes), \
                                      [](auto &...plover_a_) { kernel(plover_a_...); }, #kernel)(__VA_ARGS__))

#define PLOVER_DYNAMIC_SHARED(type, name) \
  type *const name = reinterpret_cast<type *>(::plover_sim_::st.dyn)

/* Barriers: the compiler must not keep memory in registers across them.
 * Macros, so that each call names its file and line (divergence reports).
 * That is all that tells barriers apart: __COUNTER__ would split two on
 * one line but not a helper's one barrier reached from two call sites, and
 * a return address splits what the optimizer duplicates (a false report). */
#define PLOVER_STR2_(x) #x
#define PLOVER_STR_(x) PLOVER_STR2_(x)
#define PLOVER_SITE_ __FILE__ ":" PLOVER_STR_(__LINE__)
static inline void plover_sync_(unsigned pred, const char *site) {
  __asm__ volatile("" ::: "memory");
  ::plover_sim_::barrier(pred, site);
  __asm__ volatile("" ::: "memory");
}
#define __syncthreads() plover_sync_(0, PLOVER_SITE_)
#define __syncthreads_count(pred) (plover_sync_((pred) != 0, PLOVER_SITE_), (int)::plover_sim_::st.res_count)
#define __syncthreads_and(pred) \
  (plover_sync_((pred) != 0, PLOVER_SITE_), (int)(::plover_sim_::st.res_count == ::plover_sim_::st.res_arrived))
#define __syncthreads_or(pred) (plover_sync_((pred) != 0, PLOVER_SITE_), (int)(::plover_sim_::st.res_count != 0))
/* One thread runs at a time: fences only stop the compiler reordering. */
static inline void __threadfence() { __asm__ volatile("" ::: "memory"); }
static inline void __threadfence_block() { __asm__ volatile("" ::: "memory"); }

template <class T>
static inline T __ldg(const T *p) {
  return *p;
}

static inline int __float_as_int(float f) { int i; memcpy(&i, &f, 4); return i; }
static inline unsigned int __float_as_uint(float f) { unsigned int i; memcpy(&i, &f, 4); return i; }
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline float __uint_as_float(unsigned int i) { float f; memcpy(&f, &i, 4); return f; }
static inline long long __double_as_longlong(double d) { long long i; memcpy(&i, &d, 8); return i; }
static inline double __longlong_as_double(long long i) { double d; memcpy(&d, &i, 8); return d; }

/* Atomics: CUDA's overloads; each returns the old value. Integer arithmetic
 * wraps as on a GPU. */
#define PLOVER_ATOMIC_(name, T, expr) \
  static inline T name(T *addr, T val) { T old = *addr; *addr = (expr); return old; }
#define PLOVER_ATOMIC_INT_(name, expr)              \
  PLOVER_ATOMIC_(name, int, (int)(expr))            \
  PLOVER_ATOMIC_(name, unsigned int, (unsigned int)(expr))
#define PLOVER_ATOMIC_INT64_(name, expr) \
  PLOVER_ATOMIC_INT_(name, expr)         \
  PLOVER_ATOMIC_(name, unsigned long long int, (unsigned long long int)(expr))

PLOVER_ATOMIC_INT64_(atomicAdd, (unsigned long long)old + (unsigned long long)val)
PLOVER_ATOMIC_(atomicAdd, float, old + val)
PLOVER_ATOMIC_(atomicAdd, double, old + val)
PLOVER_ATOMIC_INT_(atomicSub, (unsigned long long)old - (unsigned long long)val)
PLOVER_ATOMIC_INT64_(atomicExch, val)
PLOVER_ATOMIC_(atomicExch, float, val)
PLOVER_ATOMIC_INT64_(atomicMin, val < old ? val : old)
PLOVER_ATOMIC_(atomicMin, long long int, val < old ? val : old)
PLOVER_ATOMIC_INT64_(atomicMax, val > old ? val : old)
PLOVER_ATOMIC_(atomicMax, long long int, val > old ? val : old)
PLOVER_ATOMIC_INT64_(atomicAnd, old & val)
PLOVER_ATOMIC_INT64_(atomicOr, old | val)
PLOVER_ATOMIC_INT64_(atomicXor, old ^ val)
PLOVER_ATOMIC_(atomicInc, unsigned int, old >= val ? 0u : old + 1)
PLOVER_ATOMIC_(atomicDec, unsigned int, (old == 0 || old > val) ? val : old - 1)

#undef PLOVER_ATOMIC_
#undef PLOVER_ATOMIC_INT_
#undef PLOVER_ATOMIC_INT64_

#define PLOVER_ATOMIC_CAS_(T)                                   \
  static inline T atomicCAS(T *addr, T compare, T val) {        \
    T old = *addr;                                              \
    if (old == compare) *addr = val;                            \
    return old;                                                 \
  }
PLOVER_ATOMIC_CAS_(int)
PLOVER_ATOMIC_CAS_(unsigned int)
PLOVER_ATOMIC_CAS_(unsigned long long int)
#undef PLOVER_ATOMIC_CAS_

#endif /* __CUDACC__ */

#endif /* PLOVER_KERNEL_H */
