/* A C extension's use of ferroloop.h, built and loaded by test_c_api.py with ctypes.PyDLL:
 * a pthread without the GIL resolves a registered future and queues a callback that raises. */
#include <ferroloop.h>
#include <pthread.h>
#include <stdlib.h>

typedef struct {
    const FerroloopCAPI *api;
    FerroloopRemote *remote;
    uint64_t token;
    long value;
    int resolve_rc;
    int call_rc;
} job;

static PyObject *build_value(void *arg)
{
    long *value = arg;
    PyObject *result = PyLong_FromLong(*value);
    free(value);
    return result;
}

static int raise_error(void *arg)
{
    (void)arg;
    PyErr_SetString(PyExc_ValueError, "raised in a C callback");
    return -1;
}

static void *worker(void *arg)
{
    job *j = arg;
    long *value = malloc(sizeof *value);
    *value = j->value;
    j->resolve_rc = j->api->remote_resolve(j->remote, j->token, build_value, value);
    if (j->resolve_rc != FERROLOOP_OK) {
        free(value); /* not queued: still ours */
    }
    j->call_rc = j->api->remote_call(j->remote, raise_error, NULL);
    return NULL;
}

/* GIL held (PyDLL). A handle on `loop` and `future` registered: the job probe_run runs
 * (freed by probe_finish), or NULL with an exception. */
job *probe_start(PyObject *loop, PyObject *future, long value)
{
    const FerroloopCAPI *api = ferroloop_import_capi();
    if (api == NULL) {
        return NULL;
    }
    job *j = calloc(1, sizeof *j);
    j->api = api;
    j->value = value;
    j->remote = api->remote_new(loop);
    if (j->remote == NULL) {
        free(j);
        return NULL;
    }
    j->token = api->remote_register(j->remote, future);
    if (j->token == 0) {
        api->remote_free(j->remote);
        free(j);
        return NULL;
    }
    return j;
}

/* Runs the worker thread to its end, without the GIL: resolve's return value * 100 plus
 * remote_call's (0: both queued; -101: both refused as closed). */
int probe_run(job *j)
{
    pthread_t t;
    Py_BEGIN_ALLOW_THREADS
    pthread_create(&t, NULL, worker, j);
    pthread_join(t, NULL);
    Py_END_ALLOW_THREADS
    return j->resolve_rc * 100 + j->call_rc;
}

void probe_finish(job *j)
{
    j->api->remote_free(j->remote);
    free(j);
}

/* A remote_new on something that is not a ferroloop loop: NULL and a TypeError. */
int probe_rejects(PyObject *not_a_loop)
{
    const FerroloopCAPI *api = ferroloop_import_capi();
    if (api == NULL) {
        return -1;
    }
    FerroloopRemote *r = api->remote_new(not_a_loop);
    if (r != NULL) {
        api->remote_free(r);
        return 0;
    }
    int is_type_error = PyErr_ExceptionMatches(PyExc_TypeError);
    PyErr_Clear();
    return is_type_error;
}
