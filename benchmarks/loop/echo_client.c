/* Load generator for the stream echo benchmarks (tcp, unix) in C: epoll, one thread.
 *
 *   echo_client TRANSPORT ADDRESS CLIENTS SIZE WARMUP_S DURATION_S
 *
 * TRANSPORT is tcp (ADDRESS: a port on 127.0.0.1) or unix (ADDRESS: a socket path). It does what
 * echo_client.py does for these transports with almost no CPU time in user space, so that what
 * it costs per message is the kernel's work for its sockets, which any client pays, and the
 * server under test has the best chance to limit messages/s: CLIENTS connections, each keeping one
 * SIZE-byte request in flight (byte i of connection c's request is (c + i) % 256) and checking
 * that every reply is exactly its own request echoed back. Round trips completed during
 * DURATION_S (after WARMUP_S) are counted. Then every connection finishes its reply in flight
 * and closes, so the server sees a clean EOF on each; connections still waiting after
 * CLOSE_TIMEOUT_S are closed anyway and reported.
 *
 * Prints `RESULT <json>` with the fields echo_client.py prints for streams: msgs_per_s,
 * client_busy (this process's CPU time over the measured wall time), round_trips, problems,
 * client_loop. A connection that cannot be made is an error: a message on stderr, exit 1.
 *
 * Ownership: one `struct conn` per connection, all in one array; the epoll event carries its
 * index. A connection is open from connect until it is closed (stopping, a server-side EOF or
 * an I/O error), and only the event loop in main() changes it. Of the request in flight,
 * payload[0, sent) is written and [0, got) has come back; got never exceeds sent for a correct
 * server. Replies are checked as they arrive, so no connection keeps a reply buffer.
 *
 * Memory stays in cache whatever SIZE is: every request is a window into one shared `pattern`
 * (pattern[k] = k % 256, so connection c's request starts at pattern + c % 256), and every read
 * lands in one shared `scratch` buffer. With per-connection buffers (8 MiB at 64 connections of
 * 64 KiB) the kernel's copies miss the cache: about 1.5x the system time per 64 KiB message,
 * more than echo_client.py's.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define CONNECT_TIMEOUT_S 10
#define CLOSE_TIMEOUT_S 10.0
#define MAX_PROBLEMS 5
#define MAX_EVENTS 256

struct conn {
    int fd;                       /* -1 once closed */
    int watching_out;             /* EPOLLOUT registered: a partial write waits for room */
    int mismatched;               /* a wrong byte was reported in the reply in flight */
    const unsigned char *payload; /* SIZE bytes in `pattern`: this connection's request */
    size_t sent, got;
};

static struct conn *conns;
static size_t size;
static unsigned char *pattern; /* SIZE + 256 bytes */
static unsigned char *scratch; /* SIZE + 1 bytes: one more than a reply, to see extra bytes */
static int ep, open_conns;
static long long round_trips;
static int stopping;
static char problems[MAX_PROBLEMS][256];
static int n_problems;

static double now(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void problem(const char *fmt, ...) {
    if (n_problems == MAX_PROBLEMS) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(problems[n_problems++], sizeof problems[0], fmt, ap);
    va_end(ap);
}

static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("echo_client: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static void close_conn(struct conn *c) {
    close(c->fd); /* also leaves the epoll set: the fd is not shared */
    c->fd = -1;
    open_conns--;
}

static void watch(struct conn *c, int out) {
    struct epoll_event ev = {.events = EPOLLIN | (out ? EPOLLOUT : 0), .data.u32 = c - conns};
    if (epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev) < 0) die("epoll_ctl: %s", strerror(errno));
    c->watching_out = out;
}

/* Write as much of the request as the socket takes; wait for EPOLLOUT only while some is left. */
static void send_more(struct conn *c) {
    while (c->sent < size) {
        ssize_t n = send(c->fd, c->payload + c->sent, size - c->sent, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN) break;
            problem("connection %d: send failed: %s", (int)(c - conns), strerror(errno));
            close_conn(c);
            return;
        }
        c->sent += n;
    }
    if ((c->sent < size) != c->watching_out) watch(c, c->sent < size);
}

static void finish_reply(struct conn *c) {
    round_trips++;
    if (stopping) {
        close_conn(c);
    } else {
        c->sent = c->got = 0;
        c->mismatched = 0;
        send_more(c);
    }
}

/* Compare what just came back with the request's bytes at the same offsets. */
static void check(struct conn *c, size_t n) {
    const unsigned char *sent = c->payload + c->got;
    if (c->mismatched || memcmp(scratch, sent, n) == 0) return;
    size_t i = 0;
    while (scratch[i] == sent[i]) i++;
    problem("echo mismatch on connection %d: byte %zu of %zu is 0x%02x, sent 0x%02x",
            (int)(c - conns), c->got + i, size, scratch[i], sent[i]);
    c->mismatched = 1;
}

static void receive(struct conn *c) {
    ssize_t n = recv(c->fd, scratch, size + 1 - c->got, 0);
    if (n < 0) {
        if (errno == EINTR || errno == EAGAIN) return;
        problem("connection %d: recv failed: %s", (int)(c - conns), strerror(errno));
        close_conn(c);
    } else if (n == 0) {
        problem("connection %d: the server closed it with %zu of %zu reply bytes received "
                "(round trips counted: %lld)", (int)(c - conns), c->got, size, round_trips);
        close_conn(c);
    } else if (c->got + n > c->sent) {
        problem("echo mismatch on connection %d: %zu bytes came back, only %zu were sent",
                (int)(c - conns), c->got + n, c->sent);
        close_conn(c);
    } else {
        check(c, n);
        if ((c->got += n) == size) finish_reply(c);
    }
}

static int connect_one(const char *transport, const char *address, int index) {
    struct sockaddr_storage addr = {0};
    socklen_t len;
    int tcp = strcmp(transport, "tcp") == 0;
    if (tcp) {
        struct sockaddr_in *in = (struct sockaddr_in *)&addr;
        in->sin_family = AF_INET;
        in->sin_port = htons(atoi(address));
        in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        len = sizeof *in;
    } else {
        struct sockaddr_un *un = (struct sockaddr_un *)&addr;
        if (strlen(address) >= sizeof un->sun_path)
            die("unix socket path longer than %zu bytes: %s", sizeof un->sun_path - 1, address);
        un->sun_family = AF_UNIX;
        strcpy(un->sun_path, address);
        len = sizeof *un;
    }
    int fd = socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) die("socket: %s", strerror(errno));
    /* A blocking connect bounded by SO_SNDTIMEO; the socket is made non-blocking after. */
    struct timeval timeout = {.tv_sec = CONNECT_TIMEOUT_S};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
    if (connect(fd, (struct sockaddr *)&addr, len) < 0) {
        const char *why = errno == EINPROGRESS ? "timed out" : strerror(errno);
        die("connection %d to %s %s%s: %s", index, transport, tcp ? "127.0.0.1:" : "", address,
            why);
    }
    int one = 1;
    if (tcp && setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0)
        die("TCP_NODELAY: %s", strerror(errno));
    if (fcntl(fd, F_SETFL, O_NONBLOCK) < 0) die("O_NONBLOCK: %s", strerror(errno));
    return fd;
}

static void print_json_string(const char *text) {
    putchar('"');
    for (const unsigned char *p = (const unsigned char *)text; *p; p++) {
        if (*p == '"' || *p == '\\') {
            printf("\\%c", *p);
        } else if (*p < 0x20) {
            printf("\\u%04x", *p);
        } else {
            putchar(*p);
        }
    }
    putchar('"');
}

int main(int argc, char **argv) {
    if (argc != 7 || (strcmp(argv[1], "tcp") != 0 && strcmp(argv[1], "unix") != 0)) {
        fprintf(stderr, "usage: %s tcp|unix ADDRESS CLIENTS SIZE WARMUP_S DURATION_S\n", argv[0]);
        return 2;
    }
    int clients = atoi(argv[3]);
    size = strtoul(argv[4], NULL, 10);
    double warmup_s = atof(argv[5]), duration_s = atof(argv[6]);
    if (clients < 1 || size < 1 || warmup_s < 0 || duration_s <= 0)
        die("CLIENTS and SIZE must be at least 1, WARMUP_S at least 0, DURATION_S above 0");
    conns = calloc(clients, sizeof *conns);
    pattern = malloc(size + 256);
    scratch = malloc(size + 1);
    ep = epoll_create1(EPOLL_CLOEXEC);
    if (!conns || !pattern || !scratch || ep < 0) die("setup: %s", strerror(errno));
    for (size_t k = 0; k < size + 256; k++) pattern[k] = (unsigned char)(k % 256);
    for (int i = 0; i < clients; i++) {
        struct conn *c = &conns[i];
        c->payload = pattern + i % 256;
        c->fd = connect_one(argv[1], argv[2], i);
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = i};
        if (epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev) < 0) die("epoll_ctl: %s", strerror(errno));
        open_conns++;
    }
    for (int i = 0; i < clients; i++) send_more(&conns[i]);

    /* Phases: warming up until t0, measuring until t1, then stopping until every connection
     * has closed or the close deadline has passed. */
    double t0 = now(CLOCK_MONOTONIC) + warmup_s, t1 = t0 + duration_s, deadline = 0;
    double wall0 = t0, wall1 = t1, cpu0 = 0, cpu1 = 0;
    long long count0 = 0, count1 = 0;
    int measuring = 0;
    struct epoll_event events[MAX_EVENTS];
    while (open_conns > 0) {
        double t = now(CLOCK_MONOTONIC);
        if (!measuring && !stopping && t >= t0) {
            measuring = 1;
            count0 = round_trips, wall0 = t, cpu0 = now(CLOCK_PROCESS_CPUTIME_ID);
        }
        if (measuring && t >= t1) {
            measuring = 0, stopping = 1;
            count1 = round_trips, wall1 = t, cpu1 = now(CLOCK_PROCESS_CPUTIME_ID);
            deadline = t + CLOSE_TIMEOUT_S;
        }
        if (stopping && t >= deadline) break;
        double next = stopping ? deadline : measuring ? t1 : t0;
        int n = epoll_wait(ep, events, MAX_EVENTS, (int)((next - t) * 1e3) + 1);
        if (n < 0 && errno != EINTR) die("epoll_wait: %s", strerror(errno));
        for (int i = 0; i < n; i++) {
            struct conn *c = &conns[events[i].data.u32];
            if (c->fd >= 0 && events[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP)) receive(c);
            if (c->fd >= 0 && events[i].events & EPOLLOUT) send_more(c);
        }
    }
    if (!stopping) { /* every connection closed early: measure up to now */
        problem("every connection closed before the measurement ended");
        count1 = round_trips, wall1 = now(CLOCK_MONOTONIC), cpu1 = now(CLOCK_PROCESS_CPUTIME_ID);
        if (!measuring) count0 = count1, wall0 = wall1, cpu0 = cpu1;
    }
    if (open_conns > 0) {
        problem("%d of %d connections got no complete reply to their last request within %.0f s "
                "(round trips counted: %lld); closed them",
                open_conns, clients, CLOSE_TIMEOUT_S, round_trips);
        for (int i = 0; i < clients; i++)
            if (conns[i].fd >= 0) close_conn(&conns[i]);
    }

    double elapsed = wall1 - wall0;
    printf("RESULT {\"msgs_per_s\": %.3f, \"client_busy\": %.4f, \"round_trips\": %lld, "
           "\"client_loop\": \"C with epoll\", \"problems\": [",
           elapsed > 0 ? (count1 - count0) / elapsed : 0.0,
           elapsed > 0 ? (cpu1 - cpu0) / elapsed : 0.0, round_trips);
    for (int i = 0; i < n_problems; i++) {
        if (i) fputs(", ", stdout);
        print_json_string(problems[i]);
    }
    puts("]}");
    return 0;
}
