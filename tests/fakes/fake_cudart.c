/* A fake CUDA runtime with known answers, for the VRAM holder's tests (xover.hardware.vram).
 * FAKE_CUDA_DEVICES (default 1), FAKE_CUDA_TOTAL and FAKE_CUDA_FREE (bytes) describe the card;
 * FAKE_CUDA_MAX_ALLOC caps one allocation (larger ones fail, as a fragmented card's would);
 * FAKE_CUDA_CONTEXT is what creating the context costs. Allocations lower the free memory. */
#include <stdlib.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

static unsigned long long allocated = 0;
static int context = 0;

static unsigned long long env(const char *name, unsigned long long fallback) {
    const char *v = getenv(name);
    return v ? strtoull(v, NULL, 10) : fallback;
}

int cudaGetDeviceCount(int *n) { *n = (int)env("FAKE_CUDA_DEVICES", 1); return 0; }
int cudaSetDevice(int d) { return d < (int)env("FAKE_CUDA_DEVICES", 1) ? 0 : 101; }

int cudaFree(void *p) {
    if (p == NULL) { if (!context) { context = 1; allocated += env("FAKE_CUDA_CONTEXT", 0); } return 0; }
    return 0;
}

int cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    unsigned long long free0 = env("FAKE_CUDA_FREE", 0);
    *total_bytes = (size_t)env("FAKE_CUDA_TOTAL", free0);
    *free_bytes = (size_t)(free0 > allocated ? free0 - allocated : 0);
    return 0;
}

int cudaMalloc(void **p, size_t size) {
    unsigned long long free0 = env("FAKE_CUDA_FREE", 0);
    if (size > env("FAKE_CUDA_MAX_ALLOC", ~0ULL) || allocated + size > free0) return 2; /* cudaErrorMemoryAllocation */
    allocated += size;
    *p = (void *)(0x1000 + allocated);  /* never dereferenced */
    return 0;
}

#ifdef __cplusplus
}
#endif
