/* Load generator for the echo benchmarks in C: epoll, one thread; OpenSSL for tls.
 *
 *   echo_client TRANSPORT ADDRESS CLIENTS SIZE WARMUP_S DURATION_S [CAFILE]
 *
 * TRANSPORT is tcp, tls or udp (ADDRESS: a port on 127.0.0.1) or unix (ADDRESS: a socket path).
 * It does what echo_client.py does at a fraction of the CPU time: per message it costs little
 * more than the kernel's work for its sockets and, over TLS, OpenSSL's record work, which any
 * client pays, so the server under test has the best chance to limit messages/s.
 *
 * Streams (tcp, unix, tls): CLIENTS connections, each keeping one SIZE-byte request in flight
 * (byte i of connection c's request is (c + i) % 256) and checking that every reply is exactly
 * its own request echoed back. Round trips completed during DURATION_S (after WARMUP_S) are
 * counted. Then every connection finishes its reply in flight and closes, so the server sees a
 * clean EOF on each; connections still waiting after CLOSE_TIMEOUT_S are closed anyway and
 * reported.
 *
 * TLS (CAFILE required): as tcp, over TLS 1.2 or later. Each handshake verifies the server's
 * certificate chain against CAFILE and its name against `localhost` (also sent as SNI), as
 * echo_client.py's `ssl.create_default_context(cafile=...)` with server_hostname `localhost`
 * does; a handshake that fails, or that has not ended CONNECT_TIMEOUT_S after the first began,
 * is an error. A connection starts echoing when its handshake is done; the warm-up starts when
 * all are, so no handshake falls in the measured window. At the end each connection sends
 * close_notify after its last reply and waits for the server's: bytes that come before it, or
 * an end of the stream without it, are problems. Reads and writes go through SSL_read and
 * SSL_write on the socket; either may first need the socket readable or writable
 * (SSL_ERROR_WANT_READ, SSL_ERROR_WANT_WRITE: a write can wait for a read, a read for a write).
 * Read-ahead lets OpenSSL take what the socket has in one read(2); a connection then keeps
 * reading while OpenSSL holds bytes, which epoll cannot see.
 *
 * UDP: CLIENTS connected sockets, each keeping one SIZE-byte datagram in flight: an 8-byte
 * big-endian sequence number, then bytes (c + i) % 256. A datagram with no reply within
 * LOSS_TIMEOUT_S is counted lost and the next one is sent; a reply that comes after that is
 * counted late. At the end no new datagrams are sent, those in flight get 2 * LOSS_TIMEOUT_S to
 * come back, and the client sends STOP until the server echoes it (the server then ends).
 *
 * Prints `RESULT <json>` with the fields echo_client.py prints: msgs_per_s, client_busy (this
 * process's CPU time over the measured wall time), round_trips, problems, client_loop, for udp
 * lost and late, for tls `tls` (the protocol and cipher negotiated). An error (a socket that
 * cannot be connected, a failed handshake) is a message on stderr and exit status 1.
 *
 * Ownership: one `struct conn` per connection or UDP socket, all in one array; the epoll event
 * carries its index. Only the event loop in main() and the handlers it calls change them. A
 * stream connection is open from connect until it is closed (stopping, a server-side EOF or an
 * I/O error); of its request in flight, payload[0, sent) is written and [0, got) has come back,
 * and got never exceeds sent for a correct server. A TLS connection moves only forwards through
 * HANDSHAKING, ECHOING and CLOSING (after its last reply: close_notify being sent, then the
 * server's awaited); a plain one is ECHOING throughout. Replies are checked as they arrive, so
 * no connection keeps a reply buffer. A UDP socket stays open to the end; `in_flight` says whether
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
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <signal.h>
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

#define CONNECT_TIMEOUT_S 10 /* each connect; for tls also all handshakes together */
#define CLOSE_TIMEOUT_S 10.0
#define LOSS_TIMEOUT_S 0.5
#define STOP "STOP" /* shorter than any datagram (at least 8 bytes): never mistaken for one */
#define STOP_TRIES 10
#define MAX_PROBLEMS 5
#define MAX_EVENTS 256
#define TLS_NAME "localhost" /* echo_client.py's server_hostname: checked and sent as SNI */

enum phase { HANDSHAKING, ECHOING, CLOSING };
enum { WOULD_BLOCK = -1, FAILED = -2 }; /* what read_some() and write_some() return besides n */

struct conn {
    int fd;                       /* -1 once closed */
    int watching_out;             /* EPOLLOUT registered: something waits for room to write */
    int mismatched;               /* a wrong byte was reported in the reply in flight */
    const unsigned char *payload; /* SIZE bytes in `pattern`: this connection's request */
    size_t sent, got;             /* streams: of the request in flight */
    enum phase phase;             /* streams; plain ones are ECHOING throughout */
    SSL *ssl;                     /* tls: this connection's session; NULL for the others */
    int write_wants_read;         /* tls: SSL_write said WANT_READ; retried when readable */
    int read_wants_write;         /* tls: SSL_read said WANT_WRITE; retried when writable */
    int step_wants_write;         /* tls: the handshake or close_notify waits for room to write */
    int notified;                 /* tls: our close_notify is sent; the server's is awaited */
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
static SSL_CTX *tls;        /* tls only, as are the next three */
static const char *cafile;
static int handshakes_done;
static char negotiated[96]; /* the protocol and cipher of the first handshake done */
static char failure[256];   /* why the last read_some() or write_some() returned FAILED */

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

/* Put in `failure` why an OpenSSL call failed: its error queue, else errno. */
static void tls_failure(const char *call, int err) {
    int saved_errno = errno;
    char why[160];
    unsigned long code = ERR_get_error();
    if (code != 0) {
        ERR_error_string_n(code, why, sizeof why);
    } else if (err == SSL_ERROR_SYSCALL && saved_errno != 0) {
        snprintf(why, sizeof why, "%s", strerror(saved_errno));
    } else {
        snprintf(why, sizeof why, "SSL_get_error() = %d", err);
    }
    ERR_clear_error();
    snprintf(failure, sizeof failure, "%s failed: %s", call, why);
}

static void close_conn(struct conn *c) {
    SSL_free(c->ssl); /* no-op for NULL */
    c->ssl = NULL;
    close(c->fd); /* also leaves the epoll set: the fd is not shared */
    c->fd = -1;
    open_conns--;
}

static void watch(struct conn *c, int out) {
    struct epoll_event ev = {.events = EPOLLIN | (out ? EPOLLOUT : 0), .data.u32 = c - conns};
    if (epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev) < 0) die("epoll_ctl: %s", strerror(errno));
    c->watching_out = out;
}

/* Watch for EPOLLOUT exactly while something waits for room to write. */
static void rewatch(struct conn *c) {
    int out = c->phase == ECHOING
                  ? (c->sent < size && !c->write_wants_read) || c->read_wants_write
                  : c->step_wants_write;
    if (out != c->watching_out) watch(c, out);
}

/* Up to LEN bytes into `scratch`: how many, 0 at the end of the stream (for tls: the server's
 * close_notify), WOULD_BLOCK, or FAILED with `failure` saying why. */
static ssize_t read_some(struct conn *c, size_t len) {
    if (c->ssl == NULL) {
        ssize_t n = recv(c->fd, scratch, len, 0);
        if (n >= 0) return n;
        if (errno == EINTR || errno == EAGAIN) return WOULD_BLOCK;
        snprintf(failure, sizeof failure, "recv failed: %s", strerror(errno));
        return FAILED;
    }
    ERR_clear_error(); /* SSL_get_error() reads the queue: it must start empty */
    int n = SSL_read(c->ssl, scratch, (int)len);
    int err = n > 0 ? SSL_ERROR_NONE : SSL_get_error(c->ssl, n);
    c->read_wants_write = err == SSL_ERROR_WANT_WRITE;
    if (n > 0) return n;
    if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) return WOULD_BLOCK;
    if (err == SSL_ERROR_ZERO_RETURN) return 0;
    tls_failure("SSL_read", err); /* an EOF without close_notify is an error too */
    return FAILED;
}

/* Some of BUF[0, LEN) to the socket: how many bytes, WOULD_BLOCK, or FAILED (`failure`). With
 * SSL_MODE_ENABLE_PARTIAL_WRITE, a write repeated after WOULD_BLOCK has the same arguments, as
 * OpenSSL requires: the rest of the request, from the same place. */
static ssize_t write_some(struct conn *c, const unsigned char *buf, size_t len) {
    if (c->ssl == NULL) {
        ssize_t n = send(c->fd, buf, len, MSG_NOSIGNAL);
        if (n >= 0) return n;
        if (errno == EINTR || errno == EAGAIN) return WOULD_BLOCK;
        snprintf(failure, sizeof failure, "send failed: %s", strerror(errno));
        return FAILED;
    }
    ERR_clear_error();
    int n = SSL_write(c->ssl, buf, (int)len);
    int err = n > 0 ? SSL_ERROR_NONE : SSL_get_error(c->ssl, n);
    c->write_wants_read = err == SSL_ERROR_WANT_READ;
    if (n > 0) return n;
    if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) return WOULD_BLOCK;
    tls_failure("SSL_write", err);
    return FAILED;
}

/* Write as much of the request as the socket takes; rewatch() waits for room if some is left. */
static void send_more(struct conn *c) {
    while (c->sent < size) {
        ssize_t n = write_some(c, c->payload + c->sent, size - c->sent);
        if (n == WOULD_BLOCK) break;
        if (n == FAILED) {
            problem("connection %d: %s", (int)(c - conns), failure);
            close_conn(c);
            return;
        }
        c->sent += n;
    }
}

/* tls, CLOSING: send close_notify, then read until the server's; bytes before it are extra. */
static void close_tls(struct conn *c) {
    int index = (int)(c - conns);
    if (!c->notified) {
        ERR_clear_error();
        int r = SSL_shutdown(c->ssl);
        if (r < 0) {
            int err = SSL_get_error(c->ssl, r);
            if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
                c->step_wants_write = err == SSL_ERROR_WANT_WRITE;
                return;
            }
            tls_failure("SSL_shutdown", err);
            problem("connection %d: sending close_notify: %s", index, failure);
            close_conn(c);
            return;
        }
        c->notified = 1;
        if (r == 1) { /* the server's close_notify came first: reported when it was read */
            close_conn(c);
            return;
        }
    }
    ssize_t n = read_some(c, size + 1);
    c->step_wants_write = c->read_wants_write;
    if (n == WOULD_BLOCK) return;
    if (n > 0) {
        problem("echo mismatch on connection %d: %zd bytes more came back after its last reply",
                index, n);
    } else if (n == FAILED) {
        problem("connection %d: no close_notify from the server after the last reply: %s",
                index, failure);
    }
    close_conn(c);
}

static void finish_reply(struct conn *c) {
    round_trips++;
    if (stopping && c->ssl) {
        c->phase = CLOSING;
        close_tls(c);
    } else if (stopping) {
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

/* Read and check what came back; over TLS, also what OpenSSL already holds (epoll cannot see
 * it). A read asks for one byte more than the reply lacks, so extra bytes show. */
static void receive(struct conn *c) {
    do {
        ssize_t n = read_some(c, size + 1 - c->got);
        if (n == WOULD_BLOCK) return;
        if (n == FAILED) {
            problem("connection %d: %s, with %zu of %zu reply bytes received", (int)(c - conns),
                    failure, c->got, size);
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
    } while (c->fd >= 0 && c->phase == ECHOING && c->ssl && SSL_has_pending(c->ssl));
}

/* tls, HANDSHAKING: one step of SSL_connect; once done, the connection starts echoing (as
 * echo_client.py's connection_made does). A failed handshake ends the client. */
static void handshake(struct conn *c) {
    ERR_clear_error();
    int r = SSL_connect(c->ssl);
    if (r == 1) {
        if (handshakes_done++ == 0)
            snprintf(negotiated, sizeof negotiated, "%s %s", SSL_get_version(c->ssl),
                     SSL_get_cipher_name(c->ssl));
        c->phase = ECHOING;
        send_more(c);
        return;
    }
    int err = SSL_get_error(c->ssl, r);
    if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
        c->step_wants_write = err == SSL_ERROR_WANT_WRITE;
        return;
    }
    long verified = SSL_get_verify_result(c->ssl);
    if (verified != X509_V_OK)
        die("connection %d: the server's certificate does not verify against %s for the name "
            "%s: %s", (int)(c - conns), cafile, TLS_NAME, X509_verify_cert_error_string(verified));
    tls_failure("SSL_connect", err);
    die("connection %d: TLS handshake: %s", (int)(c - conns), failure);
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
    int tcp = strcmp(transport, "tcp") == 0 || tls != NULL;
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

/* What echo_client.py's ssl.create_default_context(cafile=CAFILE) sets up for a client: TLS 1.2
 * or later, the server's chain verified against CAFILE, its name checked per connection. */
static SSL_CTX *tls_context(void) {
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (ctx == NULL || SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION) != 1) {
        tls_failure("SSL_CTX_new", 0);
        die("%s", failure);
    }
    if (SSL_CTX_load_verify_locations(ctx, cafile, NULL) != 1) {
        tls_failure("SSL_CTX_load_verify_locations", 0);
        die("loading the CA file %s: %s", cafile, failure);
    }
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE);
    SSL_CTX_set_read_ahead(ctx, 1); /* one read(2) per burst of records, not two per record */
    return ctx;
}

/* A session on FD that checks the server's name as CPython's ssl module does (no partial
 * wildcards) and sends it as SNI. */
static SSL *tls_session(int fd, int index) {
    SSL *ssl = SSL_new(tls);
    if (ssl == NULL || SSL_set_fd(ssl, fd) != 1 || SSL_set_tlsext_host_name(ssl, TLS_NAME) != 1 ||
        SSL_set1_host(ssl, TLS_NAME) != 1) {
        tls_failure("setting up TLS", 0);
        die("connection %d: %s", index, failure);
    }
    SSL_set_hostflags(ssl, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
    SSL_set_connect_state(ssl);
    return ssl;
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
        if (c->fd < 0) continue;
        int in = events[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP);
        int out = events[i].events & EPOLLOUT;
        if (c->phase == HANDSHAKING) {
            handshake(c);
        } else if (c->phase == CLOSING) {
            close_tls(c);
        } else {
            if (in || (out && c->read_wants_write)) receive(c);
            if (c->fd >= 0 && c->phase == ECHOING && (out || (in && c->write_wants_read)))
                send_more(c);
        }
        if (c->fd >= 0) rewatch(c);
    }
}

static int wait_ms(double from, double until) {
    return until > from ? (int)((until - from) * 1e3) + 1 : 0;
}

/* TLS: drive every handshake to its end or die; each connection starts echoing at its end. */
static void handshake_all(void) {
    struct epoll_event events[MAX_EVENTS];
    for (int i = 0; i < clients; i++) {
        handshake(&conns[i]);
        if (conns[i].fd >= 0) rewatch(&conns[i]);
    }
    double t = now(CLOCK_MONOTONIC), deadline = t + CONNECT_TIMEOUT_S;
    for (; handshakes_done < clients; t = now(CLOCK_MONOTONIC)) {
        if (t >= deadline)
            die("%d of %d TLS handshakes done within %d s", handshakes_done, clients,
                CONNECT_TIMEOUT_S);
        int n = epoll_wait(ep, events, MAX_EVENTS, wait_ms(t, deadline));
        if (n < 0 && errno != EINTR) die("epoll_wait: %s", strerror(errno));
        dispatch(events, n);
    }
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
    const char *transport = argc >= 7 ? argv[1] : "";
    udp = strcmp(transport, "udp") == 0;
    int use_tls = strcmp(transport, "tls") == 0;
    int known = udp || use_tls || strcmp(transport, "tcp") == 0 || strcmp(transport, "unix") == 0;
    if (!known || argc != (use_tls ? 8 : 7)) {
        fprintf(stderr,
                "usage: %s tcp|unix|udp ADDRESS CLIENTS SIZE WARMUP_S DURATION_S\n"
                "       %s tls PORT CLIENTS SIZE WARMUP_S DURATION_S CAFILE\n",
                argv[0], argv[0]);
        return 2;
    }
    clients = atoi(argv[3]);
    size = strtoul(argv[4], NULL, 10);
    double warmup_s = atof(argv[5]), duration_s = atof(argv[6]);
    if (clients < 1 || size < (udp ? 8 : 1) || warmup_s < 0 || duration_s <= 0)
        die("CLIENTS must be at least 1, SIZE at least 1 (8 for udp: the sequence number), "
            "WARMUP_S at least 0, DURATION_S above 0");
    if (use_tls) {
        if (size >= INT_MAX) die("SIZE must be below %d for tls (SSL_read's int)", INT_MAX);
        signal(SIGPIPE, SIG_IGN); /* OpenSSL writes with write(2), not send(MSG_NOSIGNAL) */
        cafile = argv[7];
        tls = tls_context();
    }
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
        c->phase = use_tls ? HANDSHAKING : ECHOING;
        if (use_tls) c->ssl = tls_session(c->fd, i);
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = i};
        if (epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev) < 0) die("epoll_ctl: %s", strerror(errno));
        open_conns++;
    }
    if (use_tls) handshake_all(); /* a connection sends its first request when it is done */
    double t = now(CLOCK_MONOTONIC);
    for (int i = 0; i < clients; i++) {
        if (udp) {
            send_datagram(&conns[i], t);
        } else if (!use_tls) {
            send_more(&conns[i]);
            if (conns[i].fd >= 0) rewatch(&conns[i]);
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
        int closing = 0;
        for (int i = 0; i < clients; i++) closing += conns[i].fd >= 0 && conns[i].phase == CLOSING;
        if (open_conns > closing)
            problem("%d of %d connections got no complete reply to their last request within "
                    "%.0f s (round trips counted: %lld); closed them",
                    open_conns - closing, clients, CLOSE_TIMEOUT_S, round_trips);
        if (closing)
            problem("%d of %d connections got no close_notify from the server within %.0f s; "
                    "closed them", closing, clients, CLOSE_TIMEOUT_S);
    }
    for (int i = 0; i < clients; i++)
        if (conns[i].fd >= 0) close_conn(&conns[i]);

    double elapsed = wall1 - wall0;
    printf("RESULT {\"msgs_per_s\": %.3f, \"client_busy\": %.4f, \"round_trips\": %lld, ",
           elapsed > 0 ? (count1 - count0) / elapsed : 0.0,
           elapsed > 0 ? (cpu1 - cpu0) / elapsed : 0.0, round_trips);
    if (udp) printf("\"lost\": %lld, \"late\": %lld, ", lost, late);
    if (use_tls) printf("\"tls\": \"%s\", ", negotiated);
    printf("\"client_loop\": \"C with epoll%s%s\", \"problems\": [", use_tls ? " and " : "",
           use_tls ? OpenSSL_version(OPENSSL_VERSION) : "");
    for (int i = 0; i < n_problems; i++) {
        if (i) fputs(", ", stdout);
        print_json_string(problems[i]);
    }
    puts("]}");
    return 0;
}
