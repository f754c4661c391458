/* Load generator for the tcp, unix and udp echo benchmarks in C: epoll, one thread.
 *
 *   echo_client TRANSPORT ADDRESS CLIENTS SIZE WARMUP_S DURATION_S
 *
 * TRANSPORT is tcp or udp (ADDRESS: a port on 127.0.0.1) or unix (ADDRESS: a socket path). It
 * does what echo_client.py does for these transports with almost no CPU time in user space, so
 * that what it costs per message is the kernel's work for its sockets, which any client pays,
 * and the server under test has the best chance to limit messages/s.
 *
 * Streams (tcp, unix): CLIENTS connections, each keeping one SIZE-byte request in flight (byte
 * i of connection c's request is (c + i) % 256) and checking that every reply is exactly its
 * own request echoed back. Round trips completed during DURATION_S (after WARMUP_S) are
 * counted. Then every connection finishes its reply in flight and closes, so the server sees a
 * clean EOF on each; connections still waiting after CLOSE_TIMEOUT_S are closed anyway and
 * reported.
 *
 * UDP: CLIENTS connected sockets, each keeping one SIZE-byte datagram in flight: an 8-byte
 * big-endian sequence number, then bytes (c + i) % 256. A datagram with no reply within
 * LOSS_TIMEOUT_S is counted lost and the next one is sent; a reply that comes after that is
 * counted late. At the end no new datagrams are sent, those in flight get 2 * LOSS_TIMEOUT_S to
 * come back, and the client sends STOP until the server echoes it (the server then ends).
 *
 * Prints `RESULT <json>` with the fields echo_client.py prints: msgs_per_s, client_busy (this
 * process's CPU time over the measured wall time), round_trips, problems, client_loop, and for
 * udp lost and late. A socket that cannot be connected is an error: a message on stderr, exit 1.
 *
 * Ownership: one `struct conn` per connection or UDP socket, all in one array; the epoll event
 * carries its index. Only the event loop in main() and the handlers it calls change them. A
 * stream connection is open from connect until it is closed (stopping, a server-side EOF or an
 * I/O error); of its request in flight, payload[0, sent) is written and [0, got) has come back,
 * and got never exceeds sent for a correct server. Replies are checked as they arrive, so no
 * connection keeps a reply buffer. A UDP socket stays open to the end; `in_flight` says whether
 * datagram `seq`, sent at `sent_at`, still waits for its reply.
 *
 * Memory stays in cache whatever SIZE is: every request is a window into one shared `pattern`
 * (pattern[k] = k % 256, so connection c's request starts at pattern + c % 256), and every read
 * lands in one shared `scratch` buffer. With per-connection buffers (8 MiB at 64 connections of
 * 64 KiB) the kernel's copies miss the cache: in one measurement that took about 1.5x the
 * system time per 64 KiB message, more than echo_client.py's.
 */
#define _GNU_SOURCE
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define CONNECT_TIMEOUT_S 10
#define CLOSE_TIMEOUT_S 10.0
#define LOSS_TIMEOUT_S 0.5
#define STOP "STOP" /* shorter than any datagram (at least 8 bytes): never mistaken for one */
#define STOP_TRIES 10
#define MAX_PROBLEMS 5
#define MAX_EVENTS 256

struct conn {
    int fd;                       /* -1 once closed */
    int watching_out;             /* EPOLLOUT registered: a partial write waits for room */
    int mismatched;               /* a wrong byte was reported in the reply in flight */
    const unsigned char *payload; /* SIZE bytes in `pattern`: this connection's request */
    size_t sent, got;             /* streams: of the request in flight */
    int in_flight;                /* udp: datagram `seq` waits for its reply */
    uint64_t seq;                 /* udp: the last datagram's number (the first is 1) */
    double sent_at;               /* udp: when it was sent, on CLOCK_MONOTONIC */
};

static struct conn *conns;
static size_t size;
static unsigned char *pattern; /* SIZE + 256 bytes */
static unsigned char *scratch; /* SIZE + 1 bytes: one more than a reply, to see extra bytes */
static int clients, ep, open_conns, udp;
static long long round_trips, lost, late, in_flight; /* the last three: udp only */
static int stopping, stop_echoed;
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

/* The next numbered datagram, unless stopping; one that cannot be sent will count as lost. */
static void send_datagram(struct conn *c, double t) {
    if (stopping) {
        in_flight -= c->in_flight;
        c->in_flight = 0;
        return;
    }
    uint64_t seq = htobe64(++c->seq);
    struct iovec iov[2] = {{&seq, 8}, {(void *)c->payload, size - 8}};
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = 2};
    if (sendmsg(c->fd, &msg, 0) < 0 && errno != EAGAIN)
        problem("socket %d: send failed: %s", (int)(c - conns), strerror(errno));
    in_flight += !c->in_flight;
    c->in_flight = 1;
    c->sent_at = t;
}

static void receive_datagram(struct conn *c) {
    ssize_t n = recv(c->fd, scratch, size + 1, 0);
    if (n < 0) {
        if (errno != EINTR && errno != EAGAIN)
            problem("socket %d: recv failed: %s", (int)(c - conns), strerror(errno));
        return;
    }
    uint64_t seq = 0;
    if (n >= 8) memcpy(&seq, scratch, sizeof seq);
    seq = be64toh(seq);
    int filler_ok = (size_t)n == size && memcmp(scratch + 8, c->payload, size - 8) == 0;
    if (filler_ok && c->in_flight && seq == c->seq) {
        round_trips++;
        send_datagram(c, now(CLOCK_MONOTONIC));
    } else if ((size_t)n == strlen(STOP) && memcmp(scratch, STOP, n) == 0) {
        stop_echoed = 1;
    } else if (filler_ok && seq <= c->seq) {
        late++; /* the reply to a datagram already counted lost */
    } else if ((size_t)n == size && seq == c->seq) {
        size_t i = 8;
        while (scratch[i] == c->payload[i - 8]) i++;
        problem("echo mismatch on socket %d: byte %zu of %zu is 0x%02x, sent 0x%02x",
                (int)(c - conns), i, size, scratch[i], c->payload[i - 8]);
    } else {
        problem("echo mismatch on socket %d: a %zd-byte datagram numbered %llu came back; "
                "%zu bytes numbered %llu were in flight", (int)(c - conns), n,
                (unsigned long long)seq, size, (unsigned long long)c->seq);
    }
}

/* Datagrams unanswered for LOSS_TIMEOUT_S are lost: send the next one. */
static void expire(double t) {
    for (int i = 0; i < clients; i++) {
        if (conns[i].in_flight && t - conns[i].sent_at > LOSS_TIMEOUT_S) {
            lost++;
            send_datagram(&conns[i], t);
        }
    }
}

static int connect_one(const char *transport, const char *address, int index) {
    struct sockaddr_storage addr = {0};
    socklen_t len;
    int tcp = strcmp(transport, "tcp") == 0;
    if (tcp || udp) {
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
    int fd = socket(addr.ss_family, (udp ? SOCK_DGRAM : SOCK_STREAM) | SOCK_CLOEXEC, 0);
    if (fd < 0) die("socket: %s", strerror(errno));
    /* A blocking connect bounded by SO_SNDTIMEO; the socket is made non-blocking after. */
    struct timeval timeout = {.tv_sec = CONNECT_TIMEOUT_S};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
    if (connect(fd, (struct sockaddr *)&addr, len) < 0) {
        const char *why = errno == EINPROGRESS ? "timed out" : strerror(errno);
        die("connection %d to %s %s%s: %s", index, transport, tcp || udp ? "127.0.0.1:" : "",
            address, why);
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

static void dispatch(const struct epoll_event *events, int n) {
    for (int i = 0; i < n; i++) {
        struct conn *c = &conns[events[i].data.u32];
        if (udp) {
            receive_datagram(c);
            continue;
        }
        if (c->fd >= 0 && events[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP)) receive(c);
        if (c->fd >= 0 && events[i].events & EPOLLOUT) send_more(c);
    }
}

static int wait_ms(double from, double until) {
    return until > from ? (int)((until - from) * 1e3) + 1 : 0;
}

/* UDP: send STOP from the first socket until the server echoes it; the server then ends. */
static void stop_server(void) {
    struct epoll_event events[MAX_EVENTS];
    for (int try = 0; try < STOP_TRIES && !stop_echoed; try++) {
        if (send(conns[0].fd, STOP, strlen(STOP), 0) < 0 && errno != EAGAIN)
            problem("sending STOP failed: %s", strerror(errno));
        double t = now(CLOCK_MONOTONIC), deadline = t + LOSS_TIMEOUT_S;
        for (; !stop_echoed && t < deadline; t = now(CLOCK_MONOTONIC)) {
            int n = epoll_wait(ep, events, MAX_EVENTS, wait_ms(t, deadline));
            if (n < 0 && errno != EINTR) die("epoll_wait: %s", strerror(errno));
            dispatch(events, n);
        }
    }
    if (!stop_echoed) problem("the server did not echo STOP in %d tries", STOP_TRIES);
}

int main(int argc, char **argv) {
    const char *transport = argc == 7 ? argv[1] : "";
    udp = strcmp(transport, "udp") == 0;
    if (!udp && strcmp(transport, "tcp") != 0 && strcmp(transport, "unix") != 0) {
        fprintf(stderr, "usage: %s tcp|unix|udp ADDRESS CLIENTS SIZE WARMUP_S DURATION_S\n",
                argv[0]);
        return 2;
    }
    clients = atoi(argv[3]);
    size = strtoul(argv[4], NULL, 10);
    double warmup_s = atof(argv[5]), duration_s = atof(argv[6]);
    if (clients < 1 || size < (udp ? 8 : 1) || warmup_s < 0 || duration_s <= 0)
        die("CLIENTS must be at least 1, SIZE at least 1 (8 for udp: the sequence number), "
            "WARMUP_S at least 0, DURATION_S above 0");
    conns = calloc(clients, sizeof *conns);
    pattern = malloc(size + 256);
    scratch = malloc(size + 1);
    ep = epoll_create1(EPOLL_CLOEXEC);
    if (!conns || !pattern || !scratch || ep < 0) die("setup: %s", strerror(errno));
    for (size_t k = 0; k < size + 256; k++) pattern[k] = (unsigned char)(k % 256);
    for (int i = 0; i < clients; i++) {
        struct conn *c = &conns[i];
        c->payload = pattern + i % 256;
        c->fd = connect_one(transport, argv[2], i);
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = i};
        if (epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev) < 0) die("epoll_ctl: %s", strerror(errno));
        open_conns++;
    }
    double t = now(CLOCK_MONOTONIC);
    for (int i = 0; i < clients; i++) {
        if (udp) {
            send_datagram(&conns[i], t);
        } else {
            send_more(&conns[i]);
        }
    }

    /* Phases: warming up until t0, measuring until t1, then stopping until no socket owes a
     * reply (every connection closed, no datagram in flight) or the deadline has passed. */
    double t0 = t + warmup_s, t1 = t0 + duration_s, deadline = 0, next_expiry = t;
    double wall0 = t0, wall1 = t1, cpu0 = 0, cpu1 = 0;
    long long count0 = 0, count1 = 0;
    int measuring = 0;
    struct epoll_event events[MAX_EVENTS];
    while (udp ? in_flight > 0 : open_conns > 0) {
        t = now(CLOCK_MONOTONIC);
        if (!measuring && !stopping && t >= t0) {
            measuring = 1;
            count0 = round_trips, wall0 = t, cpu0 = now(CLOCK_PROCESS_CPUTIME_ID);
        }
        if (measuring && t >= t1) {
            measuring = 0, stopping = 1;
            count1 = round_trips, wall1 = t, cpu1 = now(CLOCK_PROCESS_CPUTIME_ID);
            deadline = t + (udp ? 2 * LOSS_TIMEOUT_S : CLOSE_TIMEOUT_S);
        }
        if (stopping && t >= deadline) break;
        double next = stopping ? deadline : measuring ? t1 : t0;
        if (udp && t >= next_expiry) {
            expire(t);
            next_expiry = t + LOSS_TIMEOUT_S / 5;
        }
        if (udp && next_expiry < next) next = next_expiry;
        int n = epoll_wait(ep, events, MAX_EVENTS, wait_ms(t, next));
        if (n < 0 && errno != EINTR) die("epoll_wait: %s", strerror(errno));
        dispatch(events, n);
    }
    if (!stopping) { /* every connection closed early: measure up to now */
        problem("every connection closed before the measurement ended");
        count1 = round_trips, wall1 = now(CLOCK_MONOTONIC), cpu1 = now(CLOCK_PROCESS_CPUTIME_ID);
        if (!measuring) count0 = count1, wall0 = wall1, cpu0 = cpu1;
    }
    if (udp) {
        stop_server();
        if (lost)
            problem("%lld of %lld datagrams got no reply within %g s (%lld of those replies "
                    "came later)", lost, round_trips + lost, LOSS_TIMEOUT_S, late);
    } else if (open_conns > 0) {
        problem("%d of %d connections got no complete reply to their last request within %.0f s "
                "(round trips counted: %lld); closed them",
                open_conns, clients, CLOSE_TIMEOUT_S, round_trips);
    }
    for (int i = 0; i < clients; i++)
        if (conns[i].fd >= 0) close_conn(&conns[i]);

    double elapsed = wall1 - wall0;
    printf("RESULT {\"msgs_per_s\": %.3f, \"client_busy\": %.4f, \"round_trips\": %lld, ",
           elapsed > 0 ? (count1 - count0) / elapsed : 0.0,
           elapsed > 0 ? (cpu1 - cpu0) / elapsed : 0.0, round_trips);
    if (udp) printf("\"lost\": %lld, \"late\": %lld, ", lost, late);
    fputs("\"client_loop\": \"C with epoll\", \"problems\": [", stdout);
    for (int i = 0; i < n_problems; i++) {
        if (i) fputs(", ", stdout);
        print_json_string(problems[i]);
    }
    puts("]}");
    return 0;
}
