//! TLS for the server's connections (`--ssl-certfile`/`--ssl-keyfile`): rustls with the ring
//! provider, driven on the loop thread by the connection's own read and flush paths (the
//! server's `conn.rs`). No thread, no Python and no extra copy of the plaintext between the
//! socket and the HTTP codec.
//!
//! Invariants:
//! - `ConnState::out` holds plaintext exactly as on a plain connection; `TlsConn::wire` holds
//!   ciphertext not yet written. Plaintext is sealed into `wire` only while `wire` holds less
//!   than `SEAL_AHEAD`, so what waits for the socket is bounded, and `pending` (what backpressure
//!   and the cork limit look at) counts both queues.
//! - A read decrypts all the ciphertext it took from the socket and moves all the plaintext
//!   rustls produced into the read buffer: nothing is left inside rustls that only a socket
//!   readiness event could bring out (level-triggered epoll would never report it).
//! - Records rustls makes on its own (handshake flights, alerts, session tickets, close_notify)
//!   count as output (`has_output`), so the connection's flush after every read writes them.

use std::cell::RefCell;
use std::io::{self, BufRead, Write};
use std::os::fd::RawFd;
use std::sync::Arc;

use crate::outq::{Flushed, OutQueue};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig, ServerConnection};

/// Ciphertext bytes asked of each `recv`; a read that returns fewer found the socket empty.
pub const READ_CHUNK: usize = 64 * 1024;
/// Plaintext is sealed only while less than this much ciphertext waits for the socket.
const SEAL_AHEAD: usize = 64 * 1024;
/// Plaintext handed to rustls per call: at most one record's worth.
const SEAL_STEP: usize = 16 * 1024;

/// Client certificates (uvicorn's `--ssl-cert-reqs`, `ssl.CERT_*` values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    None,
    Optional,
    Required,
}

impl ClientAuth {
    pub fn from_cert_reqs(value: u8) -> Result<Self, String> {
        match value {
            0 => Ok(Self::None),
            1 => Ok(Self::Optional),
            2 => Ok(Self::Required),
            _ => Err(format!(
                "tls_client_auth must be 0 (CERT_NONE), 1 (CERT_OPTIONAL) or 2 (CERT_REQUIRED), \
                 not {value}"
            )),
        }
    }
}

/// The server's TLS settings, built once per listening socket.
pub fn server_config(
    cert_pem: &[u8],
    key_pem: &[u8],
    client_ca_pem: Option<&[u8]>,
    client_auth: ClientAuth,
    versions: &[String],
) -> Result<Arc<ServerConfig>, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("the certificate file is not valid PEM: {e}"))?;
    if certs.is_empty() {
        return Err(
            "the certificate file holds no certificate (expected PEM 'BEGIN CERTIFICATE' blocks)"
                .into(),
        );
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| {
        format!(
            "the key file holds no usable private key (PEM PKCS#8, PKCS#1 or SEC1, unencrypted): \
             {e}"
        )
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut protocols = Vec::new();
    for v in versions {
        protocols.push(match v.as_str() {
            "1.2" => &rustls::version::TLS12,
            "1.3" => &rustls::version::TLS13,
            other => {
                return Err(format!(
                    "TLS version {other:?} is not supported (only '1.2' and '1.3')"
                ))
            }
        });
    }
    if protocols.is_empty() {
        return Err("no TLS version enabled".into());
    }
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&protocols)
        .map_err(|e| format!("TLS versions: {e}"))?;
    // A CA file is read whenever it is given (as `load_verify_locations` would), so a bad one
    // is reported even while client certificates are not asked for.
    let roots = client_ca_pem.map(client_roots).transpose()?;
    let builder = match (client_auth, roots) {
        (ClientAuth::None, _) => builder.with_no_client_auth(),
        (_, None) => {
            return Err(
                "client certificates are requested (ssl_cert_reqs) but no CA file is \
                        given (ssl_ca_certs) to verify them"
                    .into(),
            )
        }
        (auth, Some(roots)) => {
            let mut verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            if auth == ClientAuth::Optional {
                verifier = verifier.allow_unauthenticated();
            }
            let verifier = verifier
                .build()
                .map_err(|e| format!("client certificate verifier: {e}"))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| format!("the certificate and key do not make a usable pair: {e}"))?;
    // This server speaks HTTP/1.1 only; a client that offers ALPN gets it named.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The CA certificates of a PEM file, at least one.
fn client_roots(pem: &[u8]) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| format!("the CA file is not valid PEM: {e}"))?;
        roots.add(cert).map_err(|e| format!("the CA file: {e}"))?;
    }
    if roots.is_empty() {
        return Err(
            "the CA file holds no certificate (expected PEM 'BEGIN CERTIFICATE' blocks)".into(),
        );
    }
    Ok(roots)
}

/// What one `read` did.
#[derive(Debug, PartialEq, Eq)]
pub enum Read {
    /// Took this many ciphertext bytes (plaintext, if any, is in the buffer).
    Took(usize),
    /// The socket has nothing now.
    WouldBlock,
    /// The peer closed: a TCP EOF, or a TLS close_notify.
    Eof,
    /// The socket failed, or the peer broke the TLS protocol (an alert is queued for it).
    Failed,
}

/// One connection's TLS session.
pub struct TlsConn {
    conn: ServerConnection,
    /// Ciphertext waiting for the socket.
    wire: OutQueue,
    notify_sent: bool,
}

thread_local! {
    /// The one transient buffer of every session on a thread: a read's ciphertext (handed to
    /// rustls before `read` returns) or a file range being sealed. Nothing stays in it between
    /// calls, so an idle connection holds none of it (64 KiB each otherwise).
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl TlsConn {
    pub fn new(config: &Arc<ServerConfig>) -> io::Result<Self> {
        let conn = ServerConnection::new(config.clone()).map_err(io::Error::other)?;
        Ok(Self {
            conn,
            wire: OutQueue::new(),
            notify_sent: false,
        })
    }

    /// Reads ciphertext once (up to `READ_CHUNK`) and appends all its plaintext to `rbuf`.
    pub fn read(&mut self, fd: RawFd, rbuf: &mut Vec<u8>) -> Read {
        SCRATCH.with_borrow_mut(|inbuf| self.read_with(fd, rbuf, inbuf))
    }

    fn read_with(&mut self, fd: RawFd, rbuf: &mut Vec<u8>, inbuf: &mut Vec<u8>) -> Read {
        inbuf.clear();
        inbuf.reserve(READ_CHUNK);
        let n = loop {
            // SAFETY: `recv` writes at most `READ_CHUNK` bytes into the spare capacity reserved
            // just above; the length is set to what it wrote.
            let n = unsafe { libc::recv(fd, inbuf.as_mut_ptr().cast(), READ_CHUNK, 0) };
            if n >= 0 {
                break n as usize;
            }
            match io::Error::last_os_error().kind() {
                io::ErrorKind::Interrupted => {}
                io::ErrorKind::WouldBlock => return Read::WouldBlock,
                _ => return Read::Failed,
            }
        };
        if n == 0 {
            return Read::Eof;
        }
        // SAFETY: the kernel initialized `n` bytes of the reserved capacity.
        unsafe { inbuf.set_len(n) };
        let mut input = &inbuf[..];
        let mut closed = false;
        while !input.is_empty() {
            // Reading from a slice fails only when rustls's buffers are full, which draining
            // the plaintext after every step below rules out.
            if self.conn.read_tls(&mut input).is_err() {
                return Read::Failed;
            }
            if self.conn.process_new_packets().is_err() {
                // rustls has queued the alert; the caller writes it and closes.
                return Read::Failed;
            }
            closed |= drain_plaintext(&mut self.conn, rbuf);
        }
        if closed {
            Read::Eof
        } else {
            Read::Took(n)
        }
    }

    /// The protocol the client and server agreed on by ALPN (`h2`, `http/1.1`), if any.
    pub fn alpn_protocol(&self) -> Option<&[u8]> {
        self.conn.alpn_protocol()
    }

    /// The handshake has not completed yet.
    pub fn is_handshaking(&self) -> bool {
        self.conn.is_handshaking()
    }

    /// Ciphertext waiting, or records rustls has yet to hand over.
    pub fn has_output(&self) -> bool {
        !self.wire.is_empty() || self.conn.wants_write()
    }

    /// Ciphertext bytes waiting for the socket.
    pub fn pending(&self) -> usize {
        self.wire.pending()
    }

    /// Seals the plaintext of `out` (`SEAL_AHEAD` at a time) and writes the ciphertext, until
    /// both are written or the socket is full.
    pub fn flush(&mut self, out: &mut OutQueue, fd: RawFd) -> io::Result<Flushed> {
        loop {
            self.take_records()?;
            self.seal(out)?;
            if self.wire.flush(fd)? == Flushed::Blocked {
                return Ok(Flushed::Blocked);
            }
            // Before the handshake completes rustls keeps plaintext itself (nothing is answered
            // before it does); it becomes records once the handshake is done.
            if out.is_empty() || self.conn.is_handshaking() {
                return Ok(Flushed::Done);
            }
        }
    }

    /// Hands plaintext from `out` to rustls while less than `SEAL_AHEAD` ciphertext waits.
    fn seal(&mut self, out: &mut OutQueue) -> io::Result<()> {
        let Self { conn, wire, .. } = self;
        SCRATCH.with_borrow_mut(|scratch| {
            while wire.pending() < SEAL_AHEAD && !out.is_empty() {
                let took = out.drain_to(SEAL_STEP, scratch, &mut |plain| {
                    let n = conn.writer().write(plain)?;
                    take_records(conn, wire)?;
                    Ok(n)
                })?;
                if took == 0 {
                    break;
                }
            }
            Ok(())
        })
    }

    /// Moves the records rustls holds into `wire`.
    fn take_records(&mut self) -> io::Result<()> {
        take_records(&mut self.conn, &mut self.wire)
    }

    /// Queues the TLS close_notify, ahead of shutting the write side; returns whether it was
    /// queued now (it is sent once).
    pub fn close_notify(&mut self) -> bool {
        if self.notify_sent {
            return false;
        }
        self.notify_sent = true;
        self.conn.send_close_notify();
        true
    }

    /// Forgets unwritten ciphertext (the connection is gone).
    pub fn clear(&mut self) {
        self.wire.clear();
    }
}

/// Moves the records `conn` holds to the tail of `wire`, with no copy in between.
fn take_records(conn: &mut ServerConnection, wire: &mut OutQueue) -> io::Result<()> {
    if !conn.wants_write() {
        return Ok(());
    }
    wire.with_tail(|tail| {
        while conn.wants_write() {
            conn.write_tls(tail)?;
        }
        Ok(())
    })
}

/// Appends the plaintext rustls holds to `rbuf`; returns whether the peer sent close_notify.
fn drain_plaintext(conn: &mut ServerConnection, rbuf: &mut Vec<u8>) -> bool {
    let mut reader = conn.reader();
    loop {
        match reader.fill_buf() {
            Ok([]) => return true,
            Ok(chunk) => {
                let n = chunk.len();
                rbuf.extend_from_slice(chunk);
                reader.consume(n);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
            Err(_) => return true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::ServerName;
    use rustls::ClientConnection;
    use std::io::Read as _;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    struct Pki {
        cert_pem: String,
        key_pem: String,
    }

    fn pki() -> Pki {
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        Pki {
            cert_pem: cert.cert.pem(),
            key_pem: cert.key_pair.serialize_pem(),
        }
    }

    fn config(pki: &Pki) -> Arc<ServerConfig> {
        server_config(
            pki.cert_pem.as_bytes(),
            pki.key_pem.as_bytes(),
            None,
            ClientAuth::None,
            &["1.2".into(), "1.3".into()],
        )
        .unwrap()
    }

    fn client(pki: &Pki) -> ClientConnection {
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(pki.cert_pem.as_bytes()) {
            roots.add(cert.unwrap()).unwrap();
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        ClientConnection::new(Arc::new(config), ServerName::try_from("localhost").unwrap()).unwrap()
    }

    /// Server side: a non-blocking socket of a pair; client side: the other end, blocking.
    struct Pair {
        server: TlsConn,
        server_sock: UnixStream,
        client: ClientConnection,
        client_sock: UnixStream,
        rbuf: Vec<u8>,
        out: OutQueue,
    }

    impl Pair {
        fn new(pki: &Pki) -> Self {
            let (server_sock, client_sock) = UnixStream::pair().unwrap();
            server_sock.set_nonblocking(true).unwrap();
            Self {
                server: TlsConn::new(&config(pki)).unwrap(),
                server_sock,
                client: client(pki),
                client_sock,
                rbuf: Vec::new(),
                out: OutQueue::new(),
            }
        }

        fn fd(&self) -> RawFd {
            self.server_sock.as_raw_fd()
        }

        /// The client writes what it has; the server reads it and writes its answer.
        fn client_to_server(&mut self) -> Read {
            while self.client.wants_write() {
                self.client.write_tls(&mut self.client_sock).unwrap();
            }
            let fd = self.fd();
            let r = self.server.read(fd, &mut self.rbuf);
            assert_eq!(self.server.flush(&mut self.out, fd).unwrap(), Flushed::Done);
            r
        }

        /// The client reads what the server wrote (it must have written something).
        fn server_to_client(&mut self) {
            self.client.read_tls(&mut self.client_sock).unwrap();
            self.client.process_new_packets().unwrap();
        }

        fn handshake(&mut self) {
            while self.client.is_handshaking() {
                assert!(matches!(self.client_to_server(), Read::Took(_)));
                self.server_to_client();
            }
            // The client's last flight (its Finished) completes the server's side.
            assert!(matches!(self.client_to_server(), Read::Took(_)));
            assert!(!self.server.is_handshaking());
        }
    }

    #[test]
    fn a_request_and_its_response_cross_in_plaintext_on_each_side() {
        let pki = pki();
        let mut p = Pair::new(&pki);
        p.handshake();
        assert_eq!(p.client.alpn_protocol(), Some(&b"http/1.1"[..]));
        p.client
            .writer()
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        assert!(matches!(p.client_to_server(), Read::Took(_)));
        assert_eq!(p.rbuf, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        p.out
            .push(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok");
        let fd = p.fd();
        assert_eq!(p.server.flush(&mut p.out, fd).unwrap(), Flushed::Done);
        assert!(p.out.is_empty() && !p.server.has_output());
        p.server_to_client();
        let mut got = vec![0; 100];
        let n = p.client.reader().read(&mut got).unwrap();
        assert_eq!(&got[..n], b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok");
    }

    #[test]
    fn a_request_read_with_the_clients_finished_is_decrypted_in_that_read() {
        // The bytes a TLS 1.3 client may send in one segment: its Finished, then at once its
        // first request, before it has read the server's session tickets. The socket is empty
        // after that one read, so no readiness event would bring out a request left in rustls.
        let pki = pki();
        let mut p = Pair::new(&pki);
        while p.client.is_handshaking() {
            assert!(matches!(p.client_to_server(), Read::Took(_)));
            p.server_to_client();
        }
        assert!(
            p.server.is_handshaking(),
            "the client's Finished has not been sent yet"
        );
        let request = b"GET /chat HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n\r\n";
        p.client.writer().write_all(request).unwrap();
        assert!(matches!(p.client_to_server(), Read::Took(_)));
        assert!(!p.server.is_handshaking());
        assert_eq!(p.rbuf, request);
        let fd = p.fd();
        assert_eq!(p.server.read(fd, &mut p.rbuf), Read::WouldBlock);
    }

    #[test]
    fn close_notify_goes_out_once_and_the_clients_close_notify_is_an_eof() {
        let pki = pki();
        let mut p = Pair::new(&pki);
        p.handshake();
        assert!(p.server.close_notify());
        assert!(!p.server.close_notify(), "sent once");
        assert!(p.server.has_output());
        let fd = p.fd();
        assert_eq!(p.server.flush(&mut p.out, fd).unwrap(), Flushed::Done);
        p.server_to_client();
        assert_eq!(
            p.client.reader().read(&mut [0; 10]).unwrap(),
            0,
            "a clean close"
        );
        p.client.send_close_notify();
        assert_eq!(p.client_to_server(), Read::Eof);
    }

    #[test]
    fn garbage_fails_the_session_and_leaves_an_alert_to_send() {
        let pki = pki();
        let mut p = Pair::new(&pki);
        (&p.client_sock)
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let fd = p.fd();
        assert_eq!(p.server.read(fd, &mut p.rbuf), Read::Failed);
        assert!(p.rbuf.is_empty(), "nothing decrypted");
        assert!(p.server.has_output(), "the alert waits to be written");
        assert_eq!(p.server.flush(&mut p.out, fd).unwrap(), Flushed::Done);
        let mut alert = [0u8; 64];
        let n = (&p.client_sock).read(&mut alert).unwrap();
        assert_eq!(alert[0], 21, "a TLS alert record ({:?})", &alert[..n]);
    }

    #[test]
    fn a_large_response_is_sealed_ahead_only_while_the_socket_takes_it() {
        let pki = pki();
        let mut p = Pair::new(&pki);
        p.handshake();
        let body: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        p.out.push(&body);
        let fd = p.fd();
        let small: libc::c_int = 64 * 1024;
        // SAFETY: setsockopt on our open socket with a valid pointer to an int and its size.
        let r = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_SNDBUF,
                (&raw const small).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(r, 0);
        assert_eq!(p.server.flush(&mut p.out, fd).unwrap(), Flushed::Blocked);
        // Ciphertext waiting is bounded; the rest stays plaintext in the queue.
        assert!(p.server.pending() <= SEAL_AHEAD + SEAL_STEP + 1024);
        assert!(p.out.pending() > 0);
        let mut got = Vec::new();
        let mut buf = vec![0; 1 << 16];
        while got.len() < body.len() {
            let _ = p.server.flush(&mut p.out, fd).unwrap();
            p.server_to_client();
            loop {
                match p.client.reader().read(&mut buf) {
                    Ok(n) if n > 0 => got.extend_from_slice(&buf[..n]),
                    _ => break,
                }
            }
        }
        assert!(got == body, "the body arrives whole and in order");
        assert!(p.out.is_empty() && !p.server.has_output());
    }

    // (certificate, key, CA, client auth, versions, what the error names)
    type Case<'a> = (
        &'a [u8],
        &'a [u8],
        Option<&'a [u8]>,
        ClientAuth,
        &'a [String],
        &'a str,
    );

    #[test]
    fn unusable_certificates_and_keys_are_refused_with_reasons() {
        let other = pki();
        let pki = pki();
        let both = ["1.2".to_string(), "1.3".to_string()];
        let (cert, key) = (pki.cert_pem.as_bytes(), pki.key_pem.as_bytes());
        let cases: [Case<'_>; 6] = [
            (b"", key, None, ClientAuth::None, &both, "no certificate"),
            (
                cert,
                b"not a key",
                None,
                ClientAuth::None,
                &both,
                "private key",
            ),
            (
                cert,
                other.key_pem.as_bytes(),
                None,
                ClientAuth::None,
                &both,
                "usable pair",
            ),
            (cert, key, None, ClientAuth::Required, &both, "no CA file"),
            (
                cert,
                key,
                Some(b"not a certificate"),
                ClientAuth::None,
                &both,
                "CA file holds no certificate",
            ),
            (
                cert,
                key,
                None,
                ClientAuth::None,
                &["1.1".to_string()],
                "not supported",
            ),
        ];
        for (cert, key, ca, auth, versions, why) in cases {
            let err = server_config(cert, key, ca, auth, versions).unwrap_err();
            assert!(err.contains(why), "{err:?} should mention {why:?}");
        }
    }
}
