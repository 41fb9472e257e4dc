// An LD_PRELOAD library that measures the host's time inside the CUDA runtime, cuDNN and cuBLAS
// calls a program makes (outermost calls only: a cuDNN call's own launches count as the cuDNN
// call's), and prints, at exit, each function's calls, total and mean time, largest first.
// What the host spends outside these calls is the program's own work. Built by
// bench/device_pack.sh; bench/device_check.sh runs cuda_bench's ResNet-50 step under it.
//   LD_PRELOAD=host_time.so HOST_TIME_OUT=host_time.txt ./cuda_bench --benchmark_filter=...
// Kernels launched with <<<>>> from code nvcc 13 compiled go through __cudaLaunchKernel (not
// cudaLaunchKernel), with __cudaPushCallConfiguration / __cudaPopCallConfiguration around it.
// With HOST_TIME_SAMPLES=path it also samples the process's call stacks every 200 us of CPU time
// (ITIMER_PROF) and writes them at exit, each frame as module and offset (with the module's
// nearest dynamic symbol where it has one); bench/host_profile.py sums them by function,
// symbolising the program's own frames with addr2line.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <execinfo.h>
#include <signal.h>
#include <sys/time.h>
#include <unistd.h>

enum {
#define NAMES(X)                                                                                   \
  X(cudaLaunchKernel) X(cudaMemcpyAsync) X(cudaMemcpy) X(cudaMemsetAsync) X(cudaMemset)           \
  X(cudaStreamSynchronize) X(cudaDeviceSynchronize) X(cudaEventSynchronize) X(cudaEventRecord)   \
  X(cudaStreamWaitEvent) X(cudaEventQuery) X(cudaEventCreateWithFlags) X(cudaEventDestroy)        \
  X(cudaMalloc) X(cudaFree) X(cudaMallocAsync) X(cudaFreeAsync) X(cudaGetDevice) X(cudaSetDevice) \
  X(cudaGetLastError) X(cudaPointerGetAttributes) X(cudaStreamGetCaptureInfo)                     \
  X(__cudaLaunchKernel) X(__cudaPushCallConfiguration) X(__cudaPopCallConfiguration)            \
  X(cudaEventCreate) X(cudaEventElapsedTime)                                                     \
  X(cudnnConvolutionForward) X(cudnnConvolutionBackwardData) X(cudnnConvolutionBackwardFilter)    \
  X(cudnnSetStream) X(cudnnBackendExecute) X(cublasSgemm_v2) X(cublasGemmEx)                      \
  X(cublasSgemmStridedBatched) X(cublasSetStream_v2) X(cublasLtMatmul)
#define ENUM(name) id_##name,
  NAMES(ENUM) id_count
};
#define STRING(name) #name,
static const char* names[] = {NAMES(STRING)};
static uint64_t calls[id_count], nanos[id_count];
static __thread int depth;

static uint64_t now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}
static void* real(const char* name) {
  void* f = dlsym(RTLD_NEXT, name);
  if (!f) {
    fprintf(stderr, "host_time: %s not found\n", name);
    abort();
  }
  return f;
}
// One wrapper per function: the arguments as the ABI passes them (pointers, integers, a dim3).
#define WRAP(ret, name, params, args)                                  \
  ret name params {                                                    \
    static ret(*next) params;                                          \
    if (!next) next = (ret(*) params)real(#name);                      \
    if (depth++) {                                                     \
      ret r = next args;                                               \
      --depth;                                                         \
      return r;                                                        \
    }                                                                  \
    const uint64_t start = now();                                      \
    ret r = next args;                                                 \
    __atomic_add_fetch(&nanos[id_##name], now() - start, __ATOMIC_RELAXED); \
    __atomic_add_fetch(&calls[id_##name], 1, __ATOMIC_RELAXED);       \
    --depth;                                                           \
    return r;                                                          \
  }
typedef struct { unsigned x, y, z; } dim3_t;
typedef void* P;
WRAP(int, cudaLaunchKernel, (const void* f, dim3_t g, dim3_t b, void** a, size_t s, P st), (f, g, b, a, s, st))
WRAP(int, __cudaLaunchKernel, (const void* k, dim3_t g, dim3_t b, void** a, size_t s, P st), (k, g, b, a, s, st))
WRAP(unsigned, __cudaPushCallConfiguration, (dim3_t g, dim3_t b, size_t s, P st), (g, b, s, st))
WRAP(int, __cudaPopCallConfiguration, (dim3_t* g, dim3_t* b, size_t* s, P st), (g, b, s, st))
WRAP(int, cudaEventCreate, (P* e), (e))
WRAP(int, cudaEventElapsedTime, (float* ms, P a, P b), (ms, a, b))
WRAP(int, cudaMemcpyAsync, (P d, const void* s, size_t n, int k, P st), (d, s, n, k, st))
WRAP(int, cudaMemcpy, (P d, const void* s, size_t n, int k), (d, s, n, k))
WRAP(int, cudaMemsetAsync, (P d, int v, size_t n, P st), (d, v, n, st))
WRAP(int, cudaMemset, (P d, int v, size_t n), (d, v, n))
WRAP(int, cudaStreamSynchronize, (P st), (st))
WRAP(int, cudaDeviceSynchronize, (void), ())
WRAP(int, cudaEventSynchronize, (P e), (e))
WRAP(int, cudaEventRecord, (P e, P st), (e, st))
WRAP(int, cudaStreamWaitEvent, (P st, P e, unsigned f), (st, e, f))
WRAP(int, cudaEventQuery, (P e), (e))
WRAP(int, cudaEventCreateWithFlags, (P* e, unsigned f), (e, f))
WRAP(int, cudaEventDestroy, (P e), (e))
WRAP(int, cudaMalloc, (P* p, size_t n), (p, n))
WRAP(int, cudaFree, (P p), (p))
WRAP(int, cudaMallocAsync, (P* p, size_t n, P st), (p, n, st))
WRAP(int, cudaFreeAsync, (P p, P st), (p, st))
WRAP(int, cudaGetDevice, (int* d), (d))
WRAP(int, cudaSetDevice, (int d), (d))
WRAP(int, cudaGetLastError, (void), ())
WRAP(int, cudaPointerGetAttributes, (P a, const void* p), (a, p))
WRAP(int, cudaStreamGetCaptureInfo, (P st, P s, P id, P g, P d, P n), (st, s, id, g, d, n))
#define CONV13 (P h, P al, P x, P xp, P w, P wp, P c, int a, P ws, size_t wn, P be, P y, P yp)
#define CONV13_ARGS (h, al, x, xp, w, wp, c, a, ws, wn, be, y, yp)
WRAP(int, cudnnConvolutionForward, CONV13, CONV13_ARGS)
WRAP(int, cudnnConvolutionBackwardData, CONV13, CONV13_ARGS)
WRAP(int, cudnnConvolutionBackwardFilter, CONV13, CONV13_ARGS)
WRAP(int, cudnnSetStream, (P h, P st), (h, st))
WRAP(int, cudnnBackendExecute, (P h, P plan, P pack), (h, plan, pack))
WRAP(int, cublasSgemm_v2, (P h, int ta, int tb, int m, int n, int k, P al, P a, int la, P b, int lb, P be, P c, int lc),
     (h, ta, tb, m, n, k, al, a, la, b, lb, be, c, lc))
WRAP(int, cublasGemmEx, (P h, int ta, int tb, int m, int n, int k, P al, P a, int at, int la, P b, int bt, int lb, P be, P c, int ct, int lc, int ctype, int algo),
     (h, ta, tb, m, n, k, al, a, at, la, b, bt, lb, be, c, ct, lc, ctype, algo))
WRAP(int, cublasSgemmStridedBatched, (P h, int ta, int tb, int m, int n, int k, P al, P a, int la, long long sa, P b, int lb, long long sb, P be, P c, int lc, long long sc, int count),
     (h, ta, tb, m, n, k, al, a, la, sa, b, lb, sb, be, c, lc, sc, count))
WRAP(int, cublasSetStream_v2, (P h, P st), (h, st))
WRAP(int, cublasLtMatmul, (P h, P d, P al, P a, P ad, P b, P bd, P be, P c, P cd, P dd, P ddesc, P algo, P ws, size_t wn, P st),
     (h, d, al, a, ad, b, bd, be, c, cd, dd, ddesc, algo, ws, wn, st))

// ---- call-stack samples (HOST_TIME_SAMPLES) ----------------------------------------------------
enum { sample_frames = 48, sample_max = 60000 };
static void* samples[sample_max][sample_frames];
static unsigned char sample_depth[sample_max];
static int sample_count;
// The process the library was loaded into: a forked child (whose timers are not inherited) writes
// nothing over its parent's files.
static pid_t owner;

static void on_sample(int signal) {
  (void)signal;
  const int i = __atomic_fetch_add(&sample_count, 1, __ATOMIC_RELAXED);
  if (i < sample_max) sample_depth[i] = (unsigned char)backtrace(samples[i], sample_frames);
}

__attribute__((constructor)) static void start_sampling(void) {
  owner = getpid();
  if (!getenv("HOST_TIME_SAMPLES")) return;
  void* warm[4];
  backtrace(warm, 4);  // loads libgcc's unwinder now, not inside the signal handler
  struct sigaction action;
  memset(&action, 0, sizeof action);
  action.sa_handler = on_sample;
  action.sa_flags = SA_RESTART;
  sigaction(SIGPROF, &action, NULL);
  struct itimerval every = {{0, 200}, {0, 200}};
  setitimer(ITIMER_PROF, &every, NULL);
}

static void write_samples(void) {
  const char* path = getenv("HOST_TIME_SAMPLES");
  if (!path || getpid() != owner || sample_count == 0) return;  // see owner; a process exec'd
  // under the same environment records nothing and writes nothing over the one that did
  struct itimerval off;
  memset(&off, 0, sizeof off);
  setitimer(ITIMER_PROF, &off, NULL);
  FILE* out = fopen(path, "w");
  if (!out) return;
  const int count = sample_count < sample_max ? sample_count : sample_max;
  fprintf(out, "# host_time samples: %d (every 200 us of CPU time); frames: module offset [symbol]\n",
          count);
  for (int i = 0; i < count; ++i) {
    fputs("S", out);
    // Frames 0-1 are this handler and the kernel's signal trampoline.
    for (int f = 2; f < sample_depth[i]; ++f) {
      Dl_info info;
      if (dladdr(samples[i][f], &info) && info.dli_fname) {
        const char* base = strrchr(info.dli_fname, '/');
        fprintf(out, " %s+0x%lx", base ? base + 1 : info.dli_fname,
                (unsigned long)((char*)samples[i][f] - (char*)info.dli_fbase));
        if (info.dli_sname) fprintf(out, "(%s)", info.dli_sname);
      } else {
        fprintf(out, " ?+%p", samples[i][f]);
      }
    }
    fputs("\n", out);
  }
  fclose(out);
}

__attribute__((destructor)) static void report(void) {
  if (getpid() != owner) return;
  write_samples();
  const char* path = getenv("HOST_TIME_OUT");
  FILE* out = path ? fopen(path, "w") : stderr;
  if (!out) out = stderr;
  int order[id_count];
  for (int i = 0; i < id_count; ++i) order[i] = i;
  for (int i = 0; i < id_count; ++i) {  // largest total first
    for (int j = i + 1; j < id_count; ++j) {
      if (nanos[order[j]] > nanos[order[i]]) {
        const int t = order[i];
        order[i] = order[j];
        order[j] = t;
      }
    }
  }
  uint64_t total = 0;
  for (int i = 0; i < id_count; ++i) total += nanos[i];
  fprintf(out, "host_time: %.1f ms inside the calls below\n%12s %12s %10s  %s\n", total / 1e6,
          "calls", "total ms", "mean us", "function");
  for (int i = 0; i < id_count; ++i) {
    const int k = order[i];
    if (!calls[k]) continue;
    fprintf(out, "%12llu %12.2f %10.2f  %s\n", (unsigned long long)calls[k], nanos[k] / 1e6,
            nanos[k] / 1e3 / (double)calls[k], names[k]);
  }
  if (out != stderr) fclose(out);
}
