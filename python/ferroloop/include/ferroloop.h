/*
 * ferroloop.h: wake a ferroloop event loop from native threads without the GIL.
 *
 * The C API is a table of function pointers exported as the capsule
 * "ferroloop._native._C_API" (version 1). Compile against it with
 * `-I$(python -c 'import ferroloop; print(ferroloop.get_include())')`.
 *
 *   const FerroloopCAPI *api = ferroloop_import_capi();       // GIL held; NULL + exception
 *   FerroloopRemote *r = api->remote_new(loop);               // GIL held; NULL + exception
 *   uint64_t tok = api->remote_register(r, future);           // GIL held; 0 + exception
 *   ... on a worker thread, no GIL:
 *   if (api->remote_resolve(r, tok, build_result, job) != FERROLOOP_OK) free_job(job);
 *   ... any thread, once nothing uses it any more:
 *   api->remote_free(r);
 *
 * Contract
 * - Compatibility: the struct begins with `version` and `size` and only ever grows at its end.
 *   Before using a field added after version 1, check FERROLOOP_CAPI_HAS(api, field).
 * - Threads: remote_new and remote_register need the GIL. remote_call, remote_resolve and
 *   remote_free may be called from any thread, with or without the GIL; they never take it.
 *   Many threads may use one handle at once. N producers racing a sleeping loop cost one
 *   eventfd write; the loop runs every queued request in one batch.
 * - Ownership of `arg`: when remote_call or remote_resolve returns FERROLOOP_OK, the loop owns
 *   the request and runs your function exactly once, on the loop's thread with the GIL held:
 *   in a loop iteration, or, if the loop is closed first, inside loop.close() (before the loop
 *   is marked closed), or, for a loop freed without close(), when it is freed (errors then go
 *   to sys.unraisablehook). Any other return value means nothing was queued and `arg` is
 *   still yours.
 * - Errors: a Python exception raised by a remote_call function (return -1 with it set) goes
 *   to the loop's call_exception_handler. An exception raised by a build function (return
 *   NULL with it set) becomes the future's exception (set_exception).
 * - Futures: remote_register keeps a reference to the future until it is resolved or the loop
 *   closes. A token is resolved once; resolving it again reports a RuntimeError to the
 *   exception handler (after your build function ran, so `arg` is still released). If the
 *   future was cancelled meanwhile, the built value is dropped. A token that is never
 *   resolved keeps its future alive until the loop closes.
 * - After close: remote_call and remote_resolve return FERROLOOP_ERR_CLOSED;
 *   remote_register fails with RuntimeError. The handle stays valid until remote_free.
 */
#ifndef FERROLOOP_H
#define FERROLOOP_H

#include <Python.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FERROLOOP_CAPI_NAME "ferroloop._native._C_API"
#define FERROLOOP_CAPI_VERSION 1

/* Return values of remote_call and remote_resolve. */
#define FERROLOOP_OK 0
/* The loop is closed (or closing): nothing was queued; the caller still owns `arg`. */
#define FERROLOOP_ERR_CLOSED (-1)
/* A NULL handle or function, or token 0: nothing was queued; the caller still owns `arg`. */
#define FERROLOOP_ERR_INVALID (-2)

/* An opaque handle on one loop. */
typedef struct FerroloopRemote FerroloopRemote;

/* Loop thread, GIL held. Return 0, or -1 with a Python exception set. Owns `arg`. */
typedef int (*ferroloop_call_fn)(void *arg);

/* Loop thread, GIL held. Return a new reference (the result), or NULL with an exception set
 * (the future's exception). Owns `arg`. */
typedef PyObject *(*ferroloop_build_fn)(void *arg);

typedef struct FerroloopCAPI {
    uint32_t version; /* FERROLOOP_CAPI_VERSION of the exporting ferroloop */
    uint32_t size;    /* sizeof(FerroloopCAPI) of the exporting ferroloop */
    /* Version 1. */
    FerroloopRemote *(*remote_new)(PyObject *loop);
    void (*remote_free)(FerroloopRemote *remote);
    int (*remote_call)(FerroloopRemote *remote, ferroloop_call_fn func, void *arg);
    uint64_t (*remote_register)(FerroloopRemote *remote, PyObject *future);
    int (*remote_resolve)(FerroloopRemote *remote, uint64_t token, ferroloop_build_fn build,
                          void *arg);
    /* Later versions append here. */
} FerroloopCAPI;

#define FERROLOOP_CAPI_HAS(api, field)                                                         \
    ((api)->size >= offsetof(FerroloopCAPI, field) + sizeof((api)->field))

/* GIL held. The table, or NULL with an exception set (ferroloop missing, or older than
 * version 1). */
static inline const FerroloopCAPI *ferroloop_import_capi(void)
{
    const FerroloopCAPI *api = (const FerroloopCAPI *)PyCapsule_Import(FERROLOOP_CAPI_NAME, 0);
    if (api == NULL) {
        return NULL;
    }
    if (api->version < 1 || !FERROLOOP_CAPI_HAS(api, remote_resolve)) {
        PyErr_Format(PyExc_ImportError, "ferroloop's C API is version %u; version 1 is needed",
                     (unsigned)api->version);
        return NULL;
    }
    return api;
}

#ifdef __cplusplus
}
#endif

#endif /* FERROLOOP_H */
