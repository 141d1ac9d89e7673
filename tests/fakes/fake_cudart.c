/* A fake CUDA runtime with known answers, for the VRAM holder's tests (xover.hardware.vram).
 * FAKE_CUDA_DEVICES (default 1), FAKE_CUDA_TOTAL and FAKE_CUDA_FREE (bytes) describe the card;
 * FAKE_CUDA_MAX_ALLOC caps one allocation (larger ones fail, as a fragmented card's would);
 * FAKE_CUDA_CONTEXT is what creating the context costs. Allocations lower the free memory.
 * Host-to-device copies (xover.hardware.detect's measurement) take size / rate: FAKE_CUDA_H2D_PINNED from memory
 * cudaMallocHost gave, FAKE_CUDA_H2D_PAGEABLE from any other (bytes/s). FAKE_CUDA_LOG, where set, gets a line
 * "context PID" when a process creates its context and "copy pinned" or "copy pageable" for each copy: what was
 * done, and in which process, seen from outside. */
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef __cplusplus
extern "C" {
#endif

static unsigned long long allocated = 0;
static int context = 0;
static void *pinned = NULL;

static unsigned long long env(const char *name, unsigned long long fallback) {
    const char *v = getenv(name);
    return v ? strtoull(v, NULL, 10) : fallback;
}

static void note(const char *what, const char *detail) {
    const char *path = getenv("FAKE_CUDA_LOG");
    FILE *f = path ? fopen(path, "a") : NULL;
    if (f) { fprintf(f, "%s %s\n", what, detail); fclose(f); }
}

static void create_context(void) {
    char pid[32];
    context = 1;
    allocated += env("FAKE_CUDA_CONTEXT", 0);
    snprintf(pid, sizeof pid, "%d", (int)getpid());
    note("context", pid);
}

int cudaGetDeviceCount(int *n) { *n = (int)env("FAKE_CUDA_DEVICES", 1); return 0; }
int cudaSetDevice(int d) { return d < (int)env("FAKE_CUDA_DEVICES", 1) ? 0 : 101; }

int cudaFree(void *p) {
    if (p == NULL) { if (!context) { create_context(); } return 0; }
    return 0;
}

int cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    unsigned long long free0 = env("FAKE_CUDA_FREE", 0);
    *total_bytes = (size_t)env("FAKE_CUDA_TOTAL", free0);
    *free_bytes = (size_t)(free0 > allocated ? free0 - allocated : 0);
    return 0;
}

int cudaMalloc(void **p, size_t size) {
    if (!context) create_context();
    unsigned long long free0 = env("FAKE_CUDA_FREE", 0);
    if (size > env("FAKE_CUDA_MAX_ALLOC", ~0ULL) || allocated + size > free0) return 2; /* cudaErrorMemoryAllocation */
    allocated += size;
    *p = (void *)(0x1000 + allocated);  /* never dereferenced */
    return 0;
}

int cudaMallocHost(void **p, size_t size) {
    if (!context) create_context();
    pinned = malloc(size);
    *p = pinned;
    return pinned ? 0 : 2;
}

int cudaFreeHost(void *p) { if (p == pinned) pinned = NULL; free(p); return 0; }

int cudaMemcpy(void *dst, const void *src, size_t size, int kind) {
    double rate = (double)env(src == pinned ? "FAKE_CUDA_H2D_PINNED" : "FAKE_CUDA_H2D_PAGEABLE", 1000000000ULL);
    double s = (double)size / rate;
    struct timespec ts = { (time_t)s, (long)((s - (double)(time_t)s) * 1e9) };
    (void)dst;
    if (kind != 1) return 1; /* only host to device */
    nanosleep(&ts, NULL);
    note("copy", src == pinned ? "pinned" : "pageable");
    return 0;
}

#ifdef __cplusplus
}
#endif
