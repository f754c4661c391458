/* The small-request client of benchmarks/isolation: one request in flight, latency of each.
 *
 *   small_client PORT MODE START_NS END_NS SAMPLES_FILE [RATE [tls]]
 *
 * MODE is `keepalive` (one connection, reused; reopened only if the server closes it) or
 * `close` (a new connection per request, sent with `Connection: close`; the latency includes
 * the connect). The client sends `GET /ping` to 127.0.0.1:PORT, reads the response (status
 * line, headers, Content-Length body), checks it is a 200 with the body `{"ping":"pong"}`, and
 * sends the next request at once: a closed loop of one. With RATE (requests per second, above
 * 0) it paces itself instead: request k is sent at its scheduled time START + k/RATE, or at
 * once when the previous answer came later than that (one request in flight, no backlog kept). START_NS and END_NS are
 * CLOCK_MONOTONIC times (Python's time.monotonic_ns()): requests sent before START_NS are the
 * warm-up; every request sent from START_NS on and answered by END_NS is a sample, its latency
 * (send of the request, or the connect in `close` mode, to the last byte of the response, from
 * clock_gettime) appended to SAMPLES_FILE as a native-endian uint64 of nanoseconds. At END_NS
 * the client stops, even in the middle of a request: every wait is a poll() bounded by END_NS,
 * so it never outlives its window by more than one poll timeout.
 *
 * With `tls` (the binary built with -DSMALL_CLIENT_TLS and linked with OpenSSL's libssl) every
 * connection speaks TLS (certificates not verified; TLS 1.3 where the server offers it), and in
 * `close` mode each latency includes the TCP connect and a full handshake.
 *
 * Prints one line:
 *
 *   RESULT {"samples": N, "warmup": N, "errors": N, "reconnects": N, "unfinished_ns": NS,
 *           "cpu_s": S, "worker_pid": PID, "first_error": "..."}
 *
 * In `keepalive` mode every new connection first asks `GET /pid` (untimed): worker_pid is the
 * process that served the last connection, so the report can say whether it shared its worker
 * with the uploads (0 in `close` mode).
 * unfinished_ns is how long the request in flight at END_NS had waited (0 if none): a lower
 * bound of one more latency, which the report counts in the maximum. errors counts wrong or
 * failed responses (the connection is then reopened). Exit status 1 on a setup failure.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <signal.h>
#include <unistd.h>
#ifdef SMALL_CLIENT_TLS
#include <openssl/err.h>
#include <openssl/ssl.h>
#endif

#define PING_BODY "{\"ping\":\"pong\"}"
#define PID_BODY "{\"pid\":"

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t end_ns;
static char first_error[160];
static uint64_t errors;

static void error(const char *what) {
    errors++;
    if (!first_error[0]) {
        snprintf(first_error, sizeof first_error, "%s (errno %d)", what, errno);
    }
}

/* Waits for `events` on fd until END_NS; 1 when ready, 0 at END_NS. */
static int wait_fd(int fd, short events) {
    for (;;) {
        uint64_t now = now_ns();
        if (now >= end_ns) {
            return 0;
        }
        uint64_t left_ms = (end_ns - now) / 1000000u + 1;
        struct pollfd p = {.fd = fd, .events = events};
        int n = poll(&p, 1, left_ms > 1000 ? 1000 : (int)left_ms);
        if (n > 0) {
            return 1;
        }
        if (n < 0 && errno != EINTR) {
            return 0;
        }
    }
}

/* The connection's byte stream: the socket itself, or TLS over it. One connection at a time. */
#ifdef SMALL_CLIENT_TLS
static SSL_CTX *tls_ctx; /* NULL: plain TCP */
static SSL *tls;         /* the open connection's session, when tls_ctx is set */

/* Waits for what the last TLS call needs; 1 when ready, 0 at END_NS or on an error. */
static int tls_wait(int fd, int ret) {
    int err = SSL_get_error(tls, ret);
    if (err == SSL_ERROR_WANT_READ) {
        return wait_fd(fd, POLLIN);
    }
    if (err == SSL_ERROR_WANT_WRITE) {
        return wait_fd(fd, POLLOUT);
    }
    return 0;
}

/* The TLS handshake on a connected socket: 1 done, 0 at END_NS or failed (counted). */
static int tls_open(int fd) {
    if (!tls_ctx) {
        return 1;
    }
    tls = SSL_new(tls_ctx);
    SSL_set_fd(tls, fd);
    for (;;) {
        int ret = SSL_connect(tls);
        if (ret == 1) {
            return 1;
        }
        int err = SSL_get_error(tls, ret);
        if ((err != SSL_ERROR_WANT_READ && err != SSL_ERROR_WANT_WRITE) || !tls_wait(fd, ret)) {
            if (now_ns() < end_ns) {
                error("TLS handshake");
            }
            SSL_free(tls);
            tls = NULL;
            return 0;
        }
    }
}
#endif

static void conn_close(int fd) {
#ifdef SMALL_CLIENT_TLS
    if (tls) {
        SSL_free(tls);
        tls = NULL;
    }
#endif
    close(fd);
}

/* All of buf, or -1 (counted as an error by the caller). */
static ssize_t conn_send(int fd, const char *buf, size_t len) {
#ifdef SMALL_CLIENT_TLS
    if (tls) {
        for (;;) {
            int ret = SSL_write(tls, buf, (int)len);
            if (ret > 0) {
                return ret;
            }
            if (!tls_wait(fd, ret)) {
                return -1;
            }
        }
    }
#endif
    return send(fd, buf, len, MSG_NOSIGNAL);
}

/* As recv(2) on a non-blocking socket: bytes, 0 at the peer's close, or -1 with errno (EAGAIN:
 * wait for POLLIN and call again). */
static ssize_t conn_recv(int fd, char *buf, size_t cap) {
#ifdef SMALL_CLIENT_TLS
    if (tls) {
        int ret = SSL_read(tls, buf, (int)cap);
        if (ret > 0) {
            return ret;
        }
        int err = SSL_get_error(tls, ret);
        if (err == SSL_ERROR_ZERO_RETURN) {
            return 0;
        }
        errno = err == SSL_ERROR_WANT_READ ? EAGAIN : (err == SSL_ERROR_SYSCALL && errno ? errno : EIO);
        if (err == SSL_ERROR_WANT_WRITE) {
            wait_fd(fd, POLLOUT); /* a renegotiation's write: then read again */
            errno = EINTR;
        }
        if (err == SSL_ERROR_SYSCALL && ret == 0) {
            return 0; /* EOF without close_notify */
        }
        return -1;
    }
#endif
    return recv(fd, buf, cap, 0);
}

/* A connected non-blocking socket, or -1 (at END_NS, or on an error counted in `errors`). */
static int open_conn(int port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        error("socket");
        return -1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) < 0 && errno != EINPROGRESS) {
        error("connect");
        close(fd);
        return -1;
    }
    if (!wait_fd(fd, POLLOUT)) {
        close(fd);
        return -1;
    }
    int err = 0;
    socklen_t len = sizeof err;
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err) {
        errno = err;
        error("connect");
        close(fd);
        return -1;
    }
#ifdef SMALL_CLIENT_TLS
    if (!tls_open(fd)) {
        close(fd);
        return -1;
    }
#endif
    return fd;
}

/* Reads one response. 1: a 200 whose body starts with `expect` (the body is then at `*body`,
 * NUL-terminated); 0: END_NS came first; -1: an error (counted). */
static int read_response(int fd, char *buf, size_t cap, const char *expect, char **body) {
    size_t have = 0, want = 0, head = 0;
    for (;;) {
        ssize_t n = conn_recv(fd, buf + have, cap - 1 - have);
        if (n > 0) {
            have += (size_t)n;
            buf[have] = 0;
            if (!want) {
                char *end = strstr(buf, "\r\n\r\n");
                if (end) {
                    char *cl = strcasestr(buf, "\r\ncontent-length:");
                    if (!cl || cl > end) {
                        error("response without Content-Length");
                        return -1;
                    }
                    head = (size_t)(end + 4 - buf);
                    want = head + strtoul(cl + 17, NULL, 10);
                    if (want >= cap) {
                        error("response too long");
                        return -1;
                    }
                }
            }
            if (want && have >= want) {
                if (have != want || strncmp(buf, "HTTP/1.1 200", 12) != 0 ||
                    strncmp(buf + head, expect, strlen(expect)) != 0) {
                    error("not a 200 with the expected body");
                    return -1;
                }
                *body = buf + head;
                return 1;
            }
            if (have == cap - 1) {
                error("response too long");
                return -1;
            }
            continue;
        }
        if (n == 0) {
            errno = 0;
            error("connection closed before the whole response");
            return -1;
        }
        if (errno == EINTR) {
            continue;
        }
        if (errno != EAGAIN) {
            error("recv");
            return -1;
        }
        if (!wait_fd(fd, POLLIN)) {
            return 0;
        }
    }
}

/* After a `Connection: close` response, waits (until END_NS, at most 1 s) for the server to
 * close first, so the TIME_WAIT state stays on its side and this client's ports are not used
 * up; then closes. */
static void close_after_server(int fd) {
    uint64_t limit = now_ns() + 1000000000u;
    char buf[512];
    while (now_ns() < limit && now_ns() < end_ns) {
        ssize_t n = conn_recv(fd, buf, sizeof buf);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
            break;
        }
        if (n < 0) {
            struct pollfd p = {.fd = fd, .events = POLLIN};
            poll(&p, 1, 50);
        }
    }
    conn_close(fd);
}

int main(int argc, char **argv) {
    if (argc < 6 || argc > 8 || (argc == 8 && strcmp(argv[7], "tls") != 0)) {
        fprintf(stderr,
                "usage: %s PORT keepalive|close START_NS END_NS SAMPLES_FILE [RATE [tls]]\n",
                argv[0]);
        return 1;
    }
    signal(SIGPIPE, SIG_IGN); /* a write to a connection the server closed is an error, not death */
    if (argc == 8) {
#ifdef SMALL_CLIENT_TLS
        tls_ctx = SSL_CTX_new(TLS_client_method());
        if (!tls_ctx) {
            fprintf(stderr, "SSL_CTX_new failed\n");
            return 1;
        }
        SSL_CTX_set_verify(tls_ctx, SSL_VERIFY_NONE, NULL);
#else
        fprintf(stderr, "built without TLS: compile with -DSMALL_CLIENT_TLS -lssl -lcrypto\n");
        return 1;
#endif
    }
    double rate = argc >= 7 ? atof(argv[6]) : 0.0;
    uint64_t period = rate > 0 ? (uint64_t)(1e9 / rate) : 0, next_send = 0;
    int port = atoi(argv[1]);
    int keepalive = strcmp(argv[2], "keepalive") == 0;
    if (!keepalive && strcmp(argv[2], "close") != 0) {
        fprintf(stderr, "MODE must be keepalive or close, not %s\n", argv[2]);
        return 1;
    }
    uint64_t start_ns = strtoull(argv[3], NULL, 10);
    end_ns = strtoull(argv[4], NULL, 10);
    FILE *out = fopen(argv[5], "wb");
    if (!out) {
        perror(argv[5]);
        return 1;
    }
    char request[128];
    int request_len = snprintf(request, sizeof request,
                               "GET /ping HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n%s\r\n", port,
                               keepalive ? "" : "Connection: close\r\n");
    char pid_request[128];
    int pid_request_len = snprintf(pid_request, sizeof pid_request,
                                   "GET /pid HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n", port);
    long worker_pid = 0;
    static char buf[65536];
    size_t cap = 1 << 16, count = 0;
    uint64_t *samples = malloc(cap * sizeof *samples);
    uint64_t warmup = 0, reconnects = 0, unfinished = 0;
    int fd = -1;
    while (now_ns() < end_ns) {
        uint64_t t0 = now_ns();
        if (fd < 0) {
            fd = open_conn(port);
            if (fd < 0) {
                uint64_t t1 = now_ns();
                if (t1 >= end_ns) { /* the connect was still pending at END_NS */
                    unfinished = t0 >= start_ns ? t1 - t0 : 0;
                    break;
                }
                usleep(1000); /* a refused connect: do not spin */
                continue;
            }
            if (keepalive) {
                /* Which worker this connection landed on, for the report (not timed). */
                char *body;
                if (conn_send(fd, pid_request, (size_t)pid_request_len) !=
                        pid_request_len ||
                    read_response(fd, buf, sizeof buf, PID_BODY, &body) != 1) {
                    conn_close(fd);
                    fd = -1;
                    continue;
                }
                worker_pid = atol(body + strlen(PID_BODY));
                reconnects += count || warmup;
                continue; /* t0 is taken again for the first timed request */
            }
        }
        if (period) {
            uint64_t now = now_ns();
            if (next_send > now) {
                uint64_t wake = next_send < end_ns ? next_send : end_ns;
                struct timespec ts = {(time_t)((wake - now) / 1000000000u),
                                      (long)((wake - now) % 1000000000u)};
                nanosleep(&ts, NULL);
                if (now_ns() >= end_ns) {
                    break;
                }
            }
            next_send = (next_send > now ? next_send : now) + period;
            t0 = now_ns();
        }
        ssize_t sent = conn_send(fd, request, (size_t)request_len);
        if (sent != request_len) { /* a fresh small request fits any socket buffer */
            error("send");
            conn_close(fd);
            fd = -1;
            continue;
        }
        char *body;
        int got = read_response(fd, buf, sizeof buf, PING_BODY, &body);
        uint64_t t1 = now_ns();
        if (got == 0) {
            unfinished = t0 >= start_ns ? t1 - t0 : 0;
            break;
        }
        if (got < 0) {
            conn_close(fd);
            fd = -1;
            continue;
        }
        if (t0 < start_ns) {
            warmup++;
        } else {
            if (count == cap) {
                cap *= 2;
                samples = realloc(samples, cap * sizeof *samples);
                if (!samples) {
                    fprintf(stderr, "out of memory\n");
                    return 1;
                }
            }
            samples[count++] = t1 - t0;
        }
        if (!keepalive) {
            close_after_server(fd);
            fd = -1;
        }
    }
    if (fd >= 0) {
        conn_close(fd);
    }
    if (fwrite(samples, sizeof *samples, count, out) != count || fclose(out) != 0) {
        perror(argv[5]);
        return 1;
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double cpu = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
                 (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
    for (char *c = first_error; *c; c++) {
        if (*c == '"' || *c == '\\') {
            *c = '\'';
        }
    }
    printf("RESULT {\"samples\": %zu, \"warmup\": %llu, \"errors\": %llu, \"reconnects\": %llu, "
           "\"unfinished_ns\": %llu, \"cpu_s\": %.3f, \"worker_pid\": %ld, "
           "\"first_error\": \"%s\"}\n",
           count, (unsigned long long)warmup, (unsigned long long)errors,
           (unsigned long long)reconnects, (unsigned long long)unfinished, cpu, worker_pid,
           first_error);
    return 0;
}
