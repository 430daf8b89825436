/*
 * cuda_file.c - cuFile (GPUDirect Storage) reads into device memory
 * (cuda_file.h). libcufile is opened with dlopen on first use rather than
 * linked, so binaries built with cuFile support start and run on machines
 * without it; there the functions answer TIDE_E_UNSUPPORTED. The header
 * (cufile.h) is needed at build time only for its types; cmake/cuda.cmake
 * defines TIDE_HAVE_CUFILE where it found one, and TIDE_CUFILE_PATH to the
 * library it found beside it (tried after the loader's own search).
 *
 * Each read registers the file handle, reads, and deregisters it: simple and
 * stateless; a caller that reads one file many times can keep a handle later
 * if registration shows up in profiles.
 */
#include "backend/cuda/cuda_file.h"

#ifdef TIDE_HAVE_CUFILE

#include <cufile.h>
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

typedef struct cufile_api {
    CUfileError_t (*driver_open)(void);
    CUfileError_t (*handle_register)(CUfileHandle_t *fh, CUfileDescr_t *descr);
    void (*handle_deregister)(CUfileHandle_t fh);
    ssize_t (*read)(CUfileHandle_t fh, void *buf, size_t size, off_t file_offset, off_t buf_offset);
} cufile_api;

static pthread_once_t api_once = PTHREAD_ONCE_INIT;
static cufile_api api;
static bool api_ok;
static char api_why[256] = "not tried";

static void api_load(void) {
    const char *names[] = {"libcufile.so.0", "libcufile.so",
#ifdef TIDE_CUFILE_PATH
                           TIDE_CUFILE_PATH,
#endif
                           NULL};
    void *h = NULL;
    for (int i = 0; names[i] && !h; i++) h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(api_why, sizeof api_why, "libcufile cannot be loaded: %s", e ? e : "not found");
        return;
    }
    /* dlsym returns void *; POSIX guarantees it converts to a function pointer */
    *(void **)&api.driver_open = dlsym(h, "cuFileDriverOpen");
    *(void **)&api.handle_register = dlsym(h, "cuFileHandleRegister");
    *(void **)&api.handle_deregister = dlsym(h, "cuFileHandleDeregister");
    *(void **)&api.read = dlsym(h, "cuFileRead");
    if (!api.driver_open || !api.handle_register || !api.handle_deregister || !api.read) {
        snprintf(api_why, sizeof api_why, "libcufile lacks the cuFile read functions");
        return;
    }
    CUfileError_t e = api.driver_open();
    if (e.err != CU_FILE_SUCCESS) {
        snprintf(api_why, sizeof api_why, "cuFileDriverOpen failed (cuFile error %d, CUDA error %d)", (int)e.err,
                 (int)e.cu_err);
        return;
    }
    api_ok = true;
}

bool tide_cuda_file_available(void) {
    pthread_once(&api_once, api_load);
    return api_ok;
}

tide_status tide_cuda_file_read(tide_backend *be, tide_ctx *ctx, int fd, uint64_t off, void *dst, size_t n) {
    if (be->kind != TIDE_BACKEND_CUDA)
        return tide_err(ctx, TIDE_E_UNSUPPORTED, "cuFile reads need the cuda backend, not '%s'", be->vt->name);
    if (!tide_cuda_file_available())
        return tide_err(ctx, TIDE_E_UNSUPPORTED, "GPUDirect Storage is not usable: %s", api_why);
    CUfileDescr_t d;
    memset(&d, 0, sizeof d);
    d.type = CU_FILE_HANDLE_TYPE_OPAQUE_FD;
    d.handle.fd = fd;
    CUfileHandle_t fh;
    CUfileError_t e = api.handle_register(&fh, &d);
    /* a file cuFile cannot take (its file system, its open flags) is not an
     * I/O error: the caller reads it through host memory instead */
    if (e.err != CU_FILE_SUCCESS)
        return tide_err(ctx, TIDE_E_UNSUPPORTED, "cuFileHandleRegister of fd %d failed (cuFile error %d, CUDA "
                        "error %d): this file cannot be read with GPUDirect Storage", fd, (int)e.err, (int)e.cu_err);
    tide_status st = TIDE_OK;
    size_t done = 0;
    while (done < n) {
        ssize_t r = api.read(fh, dst, n - done, (off_t)(off + done), (off_t)done);
        if (r <= 0) {
            st = tide_err(ctx, TIDE_E_IO, "cuFileRead of %zu bytes at offset %llu: %s", n - done,
                          (unsigned long long)(off + done),
                          r == 0 ? "end of file" : r == -1 ? "system error" : "cuFile error");
            break;
        }
        done += (size_t)r;
    }
    api.handle_deregister(fh);
    return st;
}

#else /* no cufile.h at build time */

bool tide_cuda_file_available(void) { return false; }

tide_status tide_cuda_file_read(tide_backend *be, tide_ctx *ctx, int fd, uint64_t off, void *dst, size_t n) {
    return tide_err(ctx, TIDE_E_UNSUPPORTED, "this build of tide has no GPUDirect Storage (cufile.h was not "
                    "found when it was configured)");
}

#endif
