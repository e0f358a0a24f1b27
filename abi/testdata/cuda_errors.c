/* plover.h's error slot as the CUDA target builds it, against a stand-in
 * CUDA runtime whose pending error the test sets: what plover_last_error
 * reports for each order of a launch's failure, plover_fail or
 * plover_reject, and an author's (or a library's) cudaGetLastError. */
#include <stdio.h>
#define __CUDACC__ 1
typedef int cudaError_t;
#define cudaSuccess 0
static int pending;
static cudaError_t cudaGetLastError(void) { int e = pending; pending = 0; return e; }
__attribute__((unused)) static cudaError_t cudaPeekAtLastError(void) { return pending; }
static const char *cudaGetErrorName(cudaError_t e) { (void)e; return "cudaErrorLaunchFailure"; }
#include "../plover.h"
PLOVER_BUNDLE("cuda");

static void report(const char *name) {
  const char *e = plover_last_error();
  printf("%s: %s\n", name, e == NULL ? "(none)" : e[0] == '\x1e' ? e + 1 : e);
}

int main(void) {
  pending = 1; plover_fail(0, "failed"); (void)cudaGetLastError(); report("launch, fail, clear");
  pending = 1; plover_reject(0, "bad input"); (void)cudaGetLastError(); report("launch, reject, clear");
  pending = 1; plover_fail(0, "failed"); report("launch, fail");
  plover_reject(0, "bad input"); pending = 1; report("reject, launch");
  plover_fail(0, "failed"); report("fail");
  pending = 1; report("launch");
  return 0;
}
