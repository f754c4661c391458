/* WebSocket echo load generator for benchmarks/http/ws.py: one process, epoll, no threads.
 *
 *   ws_client PORT CONNECTIONS SIZE WARMUP_S DURATION_S
 *
 * Opens CONNECTIONS to 127.0.0.1:PORT, does the RFC 6455 handshake on each (GET /ws, checks the
 * 101), then every connection keeps one binary message of SIZE bytes in flight: it sends a
 * masked frame, reads the server's echo frame, checks the payload byte for byte, and sends the
 * next one. Echoes completed after WARMUP_S are counted for DURATION_S. Prints one line:
 *
 *   RESULT {"msgs_per_s": ..., "echoes_total": ..., "client_busy": ..., "errors": N,
 *           "problems": [...]}
 *
 * echoes_total counts the warm-up's echoes too (the server's CPU time is divided by it).
 * client_busy is this process's CPU time over the measured wall time: near 1.0 means the
 * client, not the server, limits the rate. Exit status 1 on a setup failure (message on stderr).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_EVENTS 256

struct conn {
    int fd;
    unsigned char *in;  /* the echo frame being read */
    size_t have, want;  /* bytes of it read; its full length once the header is known */
};

static struct conn *conns;
static int nconns, epfd;
static size_t size;
static unsigned char *frame;  /* the masked frame every connection sends */
static size_t frame_len;
static unsigned char *payload;  /* what the echo must carry */
static long echoes_counted, echoes_total, errors;
static int counting;

static void die(const char *what) {
    fprintf(stderr, "ws_client: %s: %s\n", what, strerror(errno));
    exit(1);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double cpu_seconds(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec / 1e6;
}

static void build_frame(void) {
    size_t head = size < 126 ? 2 : size < 65536 ? 4 : 10;
    frame_len = head + 4 + size;
    frame = malloc(frame_len);
    payload = malloc(size ? size : 1);
    if (!frame || !payload) die("malloc");
    frame[0] = 0x82; /* FIN, binary */
    if (size < 126) {
        frame[1] = 0x80 | (unsigned char)size;
    } else if (size < 65536) {
        frame[1] = 0x80 | 126;
        frame[2] = size >> 8;
        frame[3] = size & 0xff;
    } else {
        frame[1] = 0x80 | 127;
        for (int i = 0; i < 8; i++) frame[2 + i] = (uint64_t)size >> (56 - 8 * i);
    }
    unsigned char key[4] = {0x37, 0xfa, 0x21, 0x3d};
    memcpy(frame + head, key, 4);
    for (size_t i = 0; i < size; i++) {
        payload[i] = (unsigned char)(i * 7 + 3);
        frame[head + 4 + i] = payload[i] ^ key[i % 4];
    }
}

static void send_all(int fd, const unsigned char *data, size_t len) {
    while (len > 0) {
        ssize_t n = send(fd, data, len, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN) {
                /* The socket buffer is full (large messages): wait until it drains. */
                struct epoll_event ev;
                int tmp = epoll_create1(0);
                ev.events = EPOLLOUT;
                ev.data.fd = fd;
                epoll_ctl(tmp, EPOLL_CTL_ADD, fd, &ev);
                epoll_wait(tmp, &ev, 1, 1000);
                close(tmp);
                continue;
            }
            die("send");
        }
        data += n;
        len -= (size_t)n;
    }
}

static void handshake(struct conn *c, int port) {
    c->fd = socket(AF_INET, SOCK_STREAM, 0);
    if (c->fd < 0) die("socket");
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(port)};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(c->fd, (struct sockaddr *)&addr, sizeof addr) < 0) die("connect");
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    static const char request[] =
        "GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";
    send_all(c->fd, (const unsigned char *)request, sizeof request - 1);
    char head[4096];
    size_t got = 0;
    while (got < sizeof head - 1) {
        ssize_t n = recv(c->fd, head + got, 1, 0); /* byte by byte: nothing past the head */
        if (n <= 0) die("reading the handshake response");
        got += (size_t)n;
        if (got >= 4 && memcmp(head + got - 4, "\r\n\r\n", 4) == 0) break;
    }
    head[got] = 0;
    if (strncmp(head, "HTTP/1.1 101", 12) != 0) {
        fprintf(stderr, "ws_client: handshake refused:\n%s\n", head);
        exit(1);
    }
    c->in = malloc(frame_len);
    if (!c->in) die("malloc");
    if (fcntl(c->fd, F_SETFL, fcntl(c->fd, F_GETFL) | O_NONBLOCK) < 0) die("fcntl");
}

/* The length of the frame header whose first bytes are in `in` (2, 4 or 10). */
static size_t head_len(const unsigned char *in) {
    size_t len7 = in[1] & 0x7f;
    return len7 == 126 ? 4 : len7 == 127 ? 10 : 2;
}

static void fail(struct conn *c) {
    errors++;
    epoll_ctl(epfd, EPOLL_CTL_DEL, c->fd, NULL);
}

/* Reads what is there, never past the echo frame (the header first, then exactly its
 * payload); on a complete echo, checks it, counts it and sends the next message. */
static void on_readable(struct conn *c) {
    for (;;) {
        size_t need = c->want ? c->want : c->have < 2 ? 2 : head_len(c->in);
        ssize_t n = recv(c->fd, c->in + c->have, need - c->have, 0);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
        if (n <= 0) {
            fail(c);
            return;
        }
        c->have += (size_t)n;
        if (!c->want && c->have >= 2 && c->have == head_len(c->in)) {
            size_t len7 = c->in[1] & 0x7f, len = len7;
            if (len7 == 126) len = (size_t)c->in[2] << 8 | c->in[3];
            if (len7 == 127) {
                len = 0;
                for (int i = 0; i < 8; i++) len = len << 8 | c->in[2 + i];
            }
            if ((c->in[0] & 0x0f) != 2 || len != size) {
                fail(c);
                return;
            }
            c->want = c->have + len;
        }
        if (c->want && c->have == c->want) {
            if (memcmp(c->in + (c->want - size), payload, size) != 0) errors++;
            echoes_total++;
            if (counting) echoes_counted++;
            c->have = c->want = 0;
            send_all(c->fd, frame, frame_len);
        }
    }
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: %s PORT CONNECTIONS SIZE WARMUP_S DURATION_S\n", argv[0]);
        return 2;
    }
    int port = atoi(argv[1]);
    nconns = atoi(argv[2]);
    size = strtoul(argv[3], NULL, 10);
    double warmup = atof(argv[4]), duration = atof(argv[5]);
    if (nconns < 1 || duration <= 0) {
        fprintf(stderr, "ws_client: CONNECTIONS must be at least 1 and DURATION_S above 0\n");
        return 2;
    }
    build_frame();
    conns = calloc((size_t)nconns, sizeof *conns);
    epfd = epoll_create1(0);
    if (!conns || epfd < 0) die("setup");
    for (int i = 0; i < nconns; i++) {
        handshake(&conns[i], port);
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &conns[i]};
        if (epoll_ctl(epfd, EPOLL_CTL_ADD, conns[i].fd, &ev) < 0) die("epoll_ctl");
    }
    for (int i = 0; i < nconns; i++) send_all(conns[i].fd, frame, frame_len);
    struct epoll_event events[MAX_EVENTS];
    double start = now(), measure_from = start + warmup, end = measure_from + duration;
    double cpu0 = 0;
    for (;;) {
        double t = now();
        if (!counting && t >= measure_from) {
            counting = 1;
            cpu0 = cpu_seconds();
        }
        if (t >= end) break;
        int n = epoll_wait(epfd, events, MAX_EVENTS, 100);
        if (n < 0 && errno != EINTR) die("epoll_wait");
        for (int i = 0; i < n; i++) on_readable(events[i].data.ptr);
    }
    double busy = (cpu_seconds() - cpu0) / duration;
    static const unsigned char close_frame[] = {0x88, 0x82, 0, 0, 0, 0, 0x03, 0xe8};
    for (int i = 0; i < nconns; i++) {
        send(conns[i].fd, close_frame, sizeof close_frame, MSG_NOSIGNAL | MSG_DONTWAIT);
        close(conns[i].fd);
    }
    printf("RESULT {\"msgs_per_s\": %.1f, \"echoes_total\": %ld, \"client_busy\": %.4f, "
           "\"errors\": %ld, \"problems\": [%s]}\n",
           echoes_counted / duration, echoes_total, busy, errors,
           errors ? "\"echo errors or closed connections\"" : "");
    return 0;
}
