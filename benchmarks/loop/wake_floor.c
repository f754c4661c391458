/* The kernel's floor under the threadsafe benchmark: the same wake-up with no Python at all.
 *
 *   wake_floor SAMPLES GAP_US WARMUP
 *
 * One thread sleeps in epoll_wait on an eventfd (as an idle loop does); the main thread, every
 * GAP_US microseconds and only after the previous wake-up was seen, reads the monotonic clock
 * and writes the eventfd. The sleeper reads the clock as soon as epoll_wait returns. Prints the
 * p50 and p99 of the difference in microseconds, over SAMPLES after WARMUP discarded ones.
 * Run it pinned like the benchmark (both threads on one core).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

static int efd, ep, total;
static volatile double t_write;
static double *lat;
static volatile int seen;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void *sleeper(void *arg) {
    (void)arg;
    struct epoll_event ev;
    while (seen < total) {
        if (epoll_wait(ep, &ev, 1, -1) != 1) continue;
        double t = now();
        uint64_t v;
        if (read(efd, &v, sizeof v) != sizeof v) continue;
        lat[seen] = t - t_write;
        __atomic_store_n(&seen, seen + 1, __ATOMIC_RELEASE);
    }
    return NULL;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s SAMPLES GAP_US WARMUP\n", argv[0]);
        return 2;
    }
    int samples = atoi(argv[1]), gap_us = atoi(argv[2]), warmup = atoi(argv[3]);
    total = samples + warmup;
    lat = calloc(total, sizeof *lat);
    efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN};
    if (!lat || efd < 0 || ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, efd, &ev) < 0) {
        perror("wake_floor: setup");
        return 1;
    }
    pthread_t th;
    if (pthread_create(&th, NULL, sleeper, NULL) != 0) return 1;
    for (int i = 0; i < total; i++) {
        usleep(gap_us);
        while (__atomic_load_n(&seen, __ATOMIC_ACQUIRE) < i) usleep(gap_us / 5 + 1);
        t_write = now();
        uint64_t one = 1;
        if (write(efd, &one, sizeof one) != sizeof one) {
            perror("wake_floor: write");
            return 1;
        }
    }
    pthread_join(th, NULL);
    qsort(lat + warmup, samples, sizeof *lat, cmp);
    printf("%.3f %.3f\n", lat[warmup + samples / 2] * 1e6, lat[warmup + samples * 99 / 100] * 1e6);
    return 0;
}
