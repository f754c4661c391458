//! The socket as the `h2` crate sees it: tokio's `AsyncRead`/`AsyncWrite` over a non-blocking
//! fd (and its TLS session), without tokio's runtime.
//!
//! Invariants:
//! - Nothing here waits or registers a waker: `Pending` only ever means "the socket would
//!   block", and the connection (`mod.rs`) is polled again by the loop when the fd is readable
//!   (its reader is registered for the connection's life, until EOF) or writable (the writer is
//!   registered while `write_blocked` is set).
//! - `early` holds the bytes the HTTP/1.1 connection had already read (the preface and what
//!   followed it); they are read before the socket, in order.
//! - Under TLS, every read appends all the plaintext rustls produced to `early` (level-triggered
//!   epoll would not report it again), and `plain` holds at most `TLS_PLAIN_HIGH` bytes of
//!   plaintext not yet sealed: beyond that `poll_write` is `Pending`.

use std::io;
use std::os::fd::RawFd;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use ferroloop_core::tls::{Read, TlsConn};
use ferroloop_core::{Flushed, OutQueue};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Plaintext queued for sealing before `poll_write` pushes back (the HTTP/1.1 side's
/// `WRITE_HIGH`).
const TLS_PLAIN_HIGH: usize = 64 * 1024;

pub(super) struct SocketIo {
    fd: RawFd,
    early: Vec<u8>,
    early_pos: usize,
    tls: Option<Box<TlsConn>>,
    /// Under TLS: plaintext `h2` wrote, to be sealed.
    plain: OutQueue,
    flags: Arc<IoFlags>,
}

/// What the connection learns from its socket while `h2` owns it.
#[derive(Default)]
pub(super) struct IoFlags {
    /// The peer closed (a TCP EOF or a TLS close_notify): nothing more will be read.
    pub(super) eof: AtomicBool,
    /// A write would have blocked: the connection watches writability until it is written.
    pub(super) write_blocked: AtomicBool,
}

impl SocketIo {
    pub(super) fn new(
        fd: RawFd,
        early: Vec<u8>,
        tls: Option<Box<TlsConn>>,
        flags: Arc<IoFlags>,
    ) -> Self {
        Self {
            fd,
            early,
            early_pos: 0,
            tls,
            plain: OutQueue::new(),
            flags,
        }
    }

    /// Copies what `early` holds into `buf`; `false` if it held nothing.
    fn read_early(&mut self, buf: &mut ReadBuf<'_>) -> bool {
        let rest = &self.early[self.early_pos..];
        if rest.is_empty() {
            return false;
        }
        let n = rest.len().min(buf.remaining());
        buf.put_slice(&rest[..n]);
        self.early_pos += n;
        if self.early_pos == self.early.len() {
            self.early.clear();
            self.early_pos = 0;
        }
        true
    }

    fn read_plain(&mut self, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        loop {
            // SAFETY: only the bytes `recv` writes are marked initialised (`assume_init`), and
            // `recv` writes at most `unfilled.len()` bytes into that memory.
            let unfilled = unsafe { buf.unfilled_mut() };
            // SAFETY: `unfilled` is valid for writes of its length, borrowed for the call.
            let n = unsafe { libc::recv(self.fd, unfilled.as_mut_ptr().cast(), unfilled.len(), 0) };
            if n > 0 {
                let n = n as usize;
                // SAFETY: the kernel initialised the first `n` bytes of `unfilled`.
                unsafe { buf.assume_init(n) };
                buf.advance(n);
                return Poll::Ready(Ok(()));
            }
            if n == 0 {
                self.flags.eof.store(true, Ordering::Relaxed);
                return Poll::Ready(Ok(()));
            }
            let err = io::Error::last_os_error();
            match err.kind() {
                io::ErrorKind::Interrupted => {}
                io::ErrorKind::WouldBlock => return Poll::Pending,
                _ => {
                    self.flags.eof.store(true, Ordering::Relaxed);
                    return Poll::Ready(Err(err));
                }
            }
        }
    }

    fn read_tls(&mut self, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        loop {
            let tls = self.tls.as_deref_mut().expect("checked by the caller");
            let got = tls.read(self.fd, &mut self.early);
            if self.read_early(buf) {
                if matches!(got, Read::Eof | Read::Failed) {
                    self.flags.eof.store(true, Ordering::Relaxed);
                }
                return Poll::Ready(Ok(()));
            }
            match got {
                // Records without plaintext (a ticket, a key update): read on.
                Read::Took(_) => {}
                Read::WouldBlock => return Poll::Pending,
                Read::Eof => {
                    self.flags.eof.store(true, Ordering::Relaxed);
                    return Poll::Ready(Ok(()));
                }
                Read::Failed => {
                    self.flags.eof.store(true, Ordering::Relaxed);
                    return Poll::Ready(Err(io::Error::other("TLS read failed")));
                }
            }
        }
    }

    /// Under TLS: seals and writes what is queued; `Pending` (and `write_blocked`) if the
    /// socket is full.
    fn flush_tls(&mut self) -> Poll<io::Result<()>> {
        let Some(tls) = self.tls.as_deref_mut() else {
            return Poll::Ready(Ok(()));
        };
        match tls.flush(&mut self.plain, self.fd) {
            Ok(Flushed::Done) if !tls.has_output() => Poll::Ready(Ok(())),
            Ok(_) => {
                self.flags.write_blocked.store(true, Ordering::Relaxed);
                Poll::Pending
            }
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    /// `sendmsg` of `bufs` without `SIGPIPE`.
    fn send_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        loop {
            // SAFETY: zero is a valid `msghdr` (no name, no control data).
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            // `IoSlice` is ABI-compatible with `iovec` on Unix (std documents it).
            msg.msg_iov = bufs.as_ptr().cast_mut().cast();
            msg.msg_iovlen = bufs.len().min(64) as _;
            // SAFETY: `msg` points at `bufs`, live and unchanged for the call.
            let n = unsafe { libc::sendmsg(self.fd, &raw const msg, libc::MSG_NOSIGNAL) };
            if n >= 0 {
                return Poll::Ready(Ok(n as usize));
            }
            let err = io::Error::last_os_error();
            match err.kind() {
                io::ErrorKind::Interrupted => {}
                io::ErrorKind::WouldBlock => {
                    self.flags.write_blocked.store(true, Ordering::Relaxed);
                    return Poll::Pending;
                }
                _ => return Poll::Ready(Err(err)),
            }
        }
    }
}

impl AsyncRead for SocketIo {
    fn poll_read(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.read_early(buf) {
            return Poll::Ready(Ok(()));
        }
        if this.flags.eof.load(Ordering::Relaxed) {
            return Poll::Ready(Ok(()));
        }
        if this.tls.is_some() {
            this.read_tls(buf)
        } else {
            this.read_plain(buf)
        }
    }
}

impl AsyncWrite for SocketIo {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().write_vectored(&[io::IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().write_vectored(bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().flush_tls()
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(tls) = this.tls.as_deref_mut() {
            tls.close_notify();
            if this.flush_tls().is_pending() {
                return Poll::Pending;
            }
        }
        // SAFETY: shutdown of our open socket; a failure (the peer is gone) changes nothing.
        unsafe { libc::shutdown(this.fd, libc::SHUT_WR) };
        Poll::Ready(Ok(()))
    }
}

impl SocketIo {
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        if self.tls.is_none() {
            return self.send_vectored(bufs);
        }
        if self.plain.pending() >= TLS_PLAIN_HIGH {
            if let Poll::Ready(Err(e)) = self.flush_tls() {
                return Poll::Ready(Err(e));
            }
            if self.plain.pending() >= TLS_PLAIN_HIGH {
                self.flags.write_blocked.store(true, Ordering::Relaxed);
                return Poll::Pending;
            }
        }
        let mut took = 0;
        for b in bufs {
            self.plain.push(b);
            took += b.len();
        }
        if let Poll::Ready(Err(e)) = self.flush_tls() {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(took))
    }
}
