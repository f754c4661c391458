/* Kernel time of the write shapes a small HTTP response can take, with no Python at all.
 *
 *   cc -O2 -o /tmp/send_shape benchmarks/http/send_shape.c -lpthread
 *   taskset -c 1 /tmp/send_shape MODE COUNT
 *
 * MODE 0: sendmsg with two buffers (a 140-byte head, a 13-byte body: how the server wrote a
 * hello response before 2026-11-23); 1: sendmsg with one 153-byte buffer; 2: send of the same
 * 153 bytes (what it does now). COUNT writes go into a loopback TCP connection (TCP_NODELAY)
 * whose other end a thread drains; prints the writing thread's CPU time per call, which is the
 * kernel's work for the call. Run the modes alternately, a few times: the machine is noisy.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static int reader_fd;

static void *drain(void *arg) {
    (void)arg;
    char buf[1 << 16];
    while (read(reader_fd, buf, sizeof buf) > 0) {
    }
    return NULL;
}

static double thread_cpu(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s MODE(0|1|2) COUNT\n", argv[0]);
        return 2;
    }
    int mode = atoi(argv[1]);
    int count = atoi(argv[2]);
    int listener = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof addr;
    if (bind(listener, (struct sockaddr *)&addr, sizeof addr) || listen(listener, 1) ||
        getsockname(listener, (struct sockaddr *)&addr, &len)) {
        perror("listen");
        return 1;
    }
    int writer = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(writer, (struct sockaddr *)&addr, sizeof addr)) {
        perror("connect");
        return 1;
    }
    reader_fd = accept(listener, NULL, NULL);
    int one = 1;
    setsockopt(writer, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    pthread_t thread;
    pthread_create(&thread, NULL, drain, NULL);
    char head[140], body[13], both[153];
    memset(head, 'h', sizeof head);
    memset(body, 'b', sizeof body);
    memset(both, 'x', sizeof both);
    double start = thread_cpu();
    for (int i = 0; i < count; i++) {
        if (mode == 0) {
            struct iovec iov[2] = {{head, sizeof head}, {body, sizeof body}};
            struct msghdr msg = {.msg_iov = iov, .msg_iovlen = 2};
            sendmsg(writer, &msg, MSG_NOSIGNAL);
        } else if (mode == 1) {
            struct iovec iov[1] = {{both, sizeof both}};
            struct msghdr msg = {.msg_iov = iov, .msg_iovlen = 1};
            sendmsg(writer, &msg, MSG_NOSIGNAL);
        } else {
            send(writer, both, sizeof both, MSG_NOSIGNAL);
        }
    }
    double spent = thread_cpu() - start;
    printf("mode %d: %.0f ns per call\n", mode, spent / count * 1e9);
    shutdown(writer, SHUT_WR);
    pthread_join(thread, NULL);
    return 0;
}
