/* The TCP echo server with no Python at all: the floor under the Protocol echo benchmark.
 *
 *   echo_floor CLIENTS
 *
 * Listens on 127.0.0.1 (a free port), prints `{"address": PORT}` on stdout, and echoes every
 * byte each connection sends, as tcp_proto_echo.py's Protocol does: one thread, level-triggered
 * epoll, one recv(2) of up to 256 KiB per readable event, and the bytes sent back at once with
 * send(2); what the socket does not take waits in the connection's own buffer, and the
 * connection stops reading until the buffer has gone out (EPOLLOUT), as a transport's flow
 * control would. It exits when every connection it accepted has closed, printing
 * `RESULT {"echoed_bytes": N, "cpu_s": T}`: T is its CPU time (user + system) from the moment
 * CLIENTS connections were accepted to the last close, as echo_server.py measures a loop's.
 *
 * Driven by echo_client.c on the other core, its messages/s are what the client and the kernel
 * allow on this machine with next to no server-side user-space cost; see echo_floor.py, which
 * runs it, for what that bounds. The report prints it under the loops' TCP echo tables.
 *
 * Ownership: one `struct conn` per accepted connection, indexed by its fd (fds are small), only
 * touched by main()'s loop; `pending[0, pending_len)` is the unsent tail of the last read.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_FDS 4096
#define READ_SIZE (256 * 1024)

struct conn {
    unsigned char *pending;
    size_t pending_len, pending_cap;
};

static struct conn conns[MAX_FDS];
static unsigned char buf[READ_SIZE];

static void die(const char *what) {
    perror(what);
    exit(1);
}

static void set_events(int ep, int fd, unsigned events) {
    struct epoll_event ev = {.events = events, .data.fd = fd};
    if (epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev) < 0) die("epoll_ctl MOD");
}

/* Sends what it can of DATA[0, LEN); keeps the rest. 0 on success, -1 if the connection failed. */
static int send_or_keep(struct conn *c, const unsigned char *data, size_t len) {
    while (len > 0) {
        ssize_t n = send((int)(c - conns), data, len, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno != EAGAIN) return -1;
            break;
        }
        data += n;
        len -= (size_t)n;
    }
    if (len > c->pending_cap) {
        c->pending = realloc(c->pending, len);
        if (c->pending == NULL) die("realloc");
        c->pending_cap = len;
    }
    memmove(c->pending, data, len);
    c->pending_len = len;
    return 0;
}

static double cpu_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc != 2 || atoi(argv[1]) <= 0) {
        fprintf(stderr, "usage: echo_floor CLIENTS\n");
        return 2;
    }
    int clients = atoi(argv[1]);
    int lsock = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (lsock < 0) die("socket");
    int one = 1;
    setsockopt(lsock, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof addr;
    if (bind(lsock, (struct sockaddr *)&addr, sizeof addr) < 0) die("bind");
    if (listen(lsock, 256) < 0) die("listen");
    if (getsockname(lsock, (struct sockaddr *)&addr, &alen) < 0) die("getsockname");
    printf("{\"address\": %d}\n", ntohs(addr.sin_port));
    fflush(stdout);

    int ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0) die("epoll_create1");
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = lsock};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, lsock, &ev) < 0) die("epoll_ctl ADD");

    long long echoed = 0;
    int open_conns = 0, accepted = 0;
    double cpu0 = -1, cpu_s = -1;
    struct epoll_event events[256];
    while (!accepted || open_conns > 0) {
        int n = epoll_wait(ep, events, 256, -1);
        if (n < 0) {
            if (errno == EINTR) continue;
            die("epoll_wait");
        }
        for (int i = 0; i < n; i++) {
            int fd = events[i].data.fd;
            if (fd == lsock) {
                int s;
                while ((s = accept4(lsock, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
                    if (s >= MAX_FDS) {
                        fprintf(stderr, "fd %d beyond MAX_FDS\n", s);
                        exit(1);
                    }
                    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    struct epoll_event cev = {.events = EPOLLIN, .data.fd = s};
                    if (epoll_ctl(ep, EPOLL_CTL_ADD, s, &cev) < 0) die("epoll_ctl ADD");
                    open_conns++;
                    if (++accepted == clients) cpu0 = cpu_seconds();
                }
                continue;
            }
            struct conn *c = &conns[fd];
            int failed = 0;
            if (c->pending_len > 0) { /* EPOLLOUT: the rest of the last read */
                size_t len = c->pending_len;
                c->pending_len = 0;
                failed = send_or_keep(c, c->pending, len) < 0;
                if (!failed && c->pending_len == 0) set_events(ep, fd, EPOLLIN);
            } else {
                ssize_t got = recv(fd, buf, sizeof buf, 0);
                if (got < 0 && (errno == EAGAIN || errno == EINTR)) continue;
                if (got <= 0) {
                    failed = 1;
                } else {
                    echoed += got;
                    failed = send_or_keep(c, buf, (size_t)got) < 0;
                    if (!failed && c->pending_len > 0) set_events(ep, fd, EPOLLOUT);
                }
            }
            if (failed) {
                epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
                close(fd);
                c->pending_len = 0;
                if (--open_conns == 0 && cpu0 >= 0) cpu_s = cpu_seconds() - cpu0;
            }
        }
    }
    if (cpu_s < 0) {
        fprintf(stderr, "only %d of %d connections were made\n", accepted, clients);
        return 1;
    }
    printf("RESULT {\"echoed_bytes\": %lld, \"cpu_s\": %.6f}\n", echoed, cpu_s);
    return 0;
}
