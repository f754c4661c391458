//! `OutQueue`: the bytes (and file ranges) a connection still has to write, flushed with
//! vectored writes (`sendmsg` on a socket, `writev` on a pipe) and zero-copy `sendfile`.
//!
//! Invariants:
//! - Segments leave the queue strictly in push order; a file range is sent only after every
//!   byte queued before it.
//! - `pending` is the exact number of bytes (buffered plus file ranges) not yet written.
//! - A fully written buffer segment is recycled as the next tail buffer, so a keep-alive
//!   connection reuses one allocation for all its responses.
//! - Socket writes use `MSG_NOSIGNAL`: a peer that went away is an `EPIPE` error, never a
//!   `SIGPIPE`. Pipe writes (`writev`, which works on any fd: pipes, ttys, sockets) cannot ask
//!   for that; a closed reader raises `SIGPIPE`, which CPython ignores from start-up (as
//!   `os.write` in asyncio's pipe transport relies on), so it is `EPIPE` there too.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use crate::sys::cvt;

/// At most this many iovecs per `sendmsg` (well under `IOV_MAX`).
const MAX_IOVECS: usize = 64;

/// A buffered run of bytes, or a range of a file sent with `sendfile`.
#[derive(Debug)]
enum Segment {
    Bytes {
        buf: Vec<u8>,
        pos: usize,
    },
    File {
        file: OwnedFd,
        offset: u64,
        remaining: u64,
    },
}

/// What a flush achieved.
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flushed {
    /// Everything queued is written.
    Done,
    /// The socket buffer is full; wait for writability.
    Blocked,
}

/// The vectored write call a queue uses: it is the only difference between writing to a socket
/// and writing to a pipe.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum WriteCall {
    /// `sendmsg(MSG_NOSIGNAL)`: sockets.
    #[default]
    SendMsg,
    /// `writev`: pipes, character devices, or a socket given as a pipe.
    WriteV,
}

impl WriteCall {
    fn write(self, fd: RawFd, iov: &[libc::iovec]) -> io::Result<usize> {
        match self {
            Self::SendMsg => sendmsg(fd, iov),
            Self::WriteV => writev(fd, iov),
        }
    }

    /// One buffer: `send(MSG_NOSIGNAL)` or `write`, which spare the kernel the `msghdr` and
    /// iovec copies and checks of `sendmsg`/`writev`.
    fn write_one(self, fd: RawFd, data: &[u8]) -> io::Result<usize> {
        let (ptr, len) = (data.as_ptr().cast::<libc::c_void>(), data.len());
        let r = match self {
            // SAFETY: `ptr` points at `len` readable bytes of `data`, alive for this call.
            Self::SendMsg => unsafe { libc::send(fd, ptr, len, libc::MSG_NOSIGNAL) },
            // SAFETY: as above.
            Self::WriteV => unsafe { libc::write(fd, ptr, len) },
        };
        cvt(r).map(|n| n as usize)
    }
}

#[derive(Debug, Default)]
pub struct OutQueue {
    segs: VecDeque<Segment>,
    pending: usize,
    spare: Vec<u8>,
    call: WriteCall,
}

impl OutQueue {
    /// A queue for a socket.
    pub fn new() -> Self {
        Self::default()
    }

    /// A queue written with `call`.
    pub fn with_call(call: WriteCall) -> Self {
        Self {
            call,
            ..Self::default()
        }
    }

    /// Bytes not yet written.
    pub fn pending(&self) -> usize {
        self.pending
    }

    pub fn is_empty(&self) -> bool {
        self.pending == 0
    }

    /// Appends bytes (to the tail buffer when there is one).
    pub fn push(&mut self, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        self.tail_buf().extend_from_slice(data);
        self.pending += data.len();
    }

    /// Lets an encoder append to the tail buffer directly: `f` gets the buffer and the bytes it
    /// appends are counted as pending.
    pub fn with_tail<R>(&mut self, f: impl FnOnce(&mut Vec<u8>) -> R) -> R {
        let buf = self.tail_buf();
        let before = buf.len();
        let r = f(buf);
        let after = self.tail_len();
        self.pending += after - before;
        r
    }

    fn tail_len(&self) -> usize {
        match self.segs.back() {
            Some(Segment::Bytes { buf, .. }) => buf.len(),
            _ => 0,
        }
    }

    fn tail_buf(&mut self) -> &mut Vec<u8> {
        if !matches!(self.segs.back(), Some(Segment::Bytes { .. })) {
            let buf = std::mem::take(&mut self.spare);
            self.segs.push_back(Segment::Bytes { buf, pos: 0 });
        }
        match self.segs.back_mut() {
            Some(Segment::Bytes { buf, .. }) => buf,
            _ => unreachable!("a bytes segment was just ensured"),
        }
    }

    /// Queues `len` bytes of `file` from `offset`, sent with `sendfile` in order.
    pub fn push_file(&mut self, file: OwnedFd, offset: u64, len: u64) {
        if len == 0 {
            return;
        }
        self.pending += len as usize;
        self.segs.push_back(Segment::File {
            file,
            offset,
            remaining: len,
        });
    }

    /// Writes the queue and then `extra` in as few syscalls as the socket allows, without
    /// copying `extra`. Returns how many bytes of `extra` were written; the caller queues the
    /// rest with [`push`](Self::push). `extra` is only tried once the queue itself is empty.
    pub fn flush_with(&mut self, fd: RawFd, extra: &[u8]) -> io::Result<usize> {
        if self.segs.is_empty() {
            // Nothing queued (the usual `write()`): one buffer, one plain write, and no iovec
            // array to set up (zeroing it cost about 80 instructions per call under callgrind).
            return write_extra(self.call, fd, extra);
        }
        // File ranges and long queues go out first on their own; what is left is a short run of
        // buffers that fits in one `sendmsg` together with `extra`.
        let has_file = self.segs.iter().any(|s| matches!(s, Segment::File { .. }));
        if (has_file || self.segs.len() >= MAX_IOVECS) && self.flush(fd)? == Flushed::Blocked {
            return Ok(0);
        }
        let mut iov = [EMPTY_IOVEC; MAX_IOVECS];
        loop {
            let mut count = self.gather(&mut iov[..MAX_IOVECS - 1]);
            if !extra.is_empty() {
                iov[count] = iovec(extra);
                count += 1;
            }
            if count == 0 {
                return Ok(0);
            }
            match self.call.write(fd, &iov[..count]) {
                Ok(n) => {
                    // A short write means the socket buffer is full: the caller queues the rest
                    // of `extra` and waits for writability.
                    let from_queue = n.min(self.pending);
                    self.consume(from_queue);
                    return Ok(n - from_queue);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(0),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Writes as much of the queue as the socket takes.
    pub fn flush(&mut self, fd: RawFd) -> io::Result<Flushed> {
        let mut iov = [EMPTY_IOVEC; MAX_IOVECS];
        while let Some(seg) = self.segs.front_mut() {
            match seg {
                Segment::Bytes { .. } => {
                    let count = self.gather(&mut iov);
                    if count == 0 {
                        // Only empty buffers at the front: drop them.
                        self.consume(0);
                        continue;
                    }
                    let want: usize = iov[..count].iter().map(|v| v.iov_len).sum();
                    match self.call.write(fd, &iov[..count]) {
                        Ok(n) => {
                            self.consume(n);
                            if n < want {
                                return Ok(Flushed::Blocked);
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            return Ok(Flushed::Blocked)
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e),
                    }
                }
                Segment::File {
                    file,
                    offset,
                    remaining,
                } => {
                    let chunk = (*remaining).min(1 << 30) as usize;
                    let mut off = *offset as libc::off_t;
                    // SAFETY: `file` is an open fd we own, `off` is a valid out-pointer for the
                    // duration of the call, and `fd` is the caller's socket.
                    let r =
                        cvt(unsafe { libc::sendfile(fd, file.as_raw_fd(), &raw mut off, chunk) });
                    match r {
                        Ok(0) => {
                            // The file is shorter than announced: the response cannot be
                            // completed truthfully.
                            return Err(io::Error::new(
                                io::ErrorKind::UnexpectedEof,
                                "file shrank while being sent",
                            ));
                        }
                        Ok(n) => {
                            let n = n as u64;
                            *offset += n;
                            *remaining -= n;
                            self.pending -= n as usize;
                            if *remaining == 0 {
                                self.segs.pop_front();
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            return Ok(Flushed::Blocked)
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e),
                    }
                }
            }
        }
        Ok(Flushed::Done)
    }

    /// Points `iov` at the unwritten buffer segments at the front of the queue, up to the first
    /// file range or `iov.len()` entries; returns how many entries it filled.
    fn gather(&self, iov: &mut [libc::iovec]) -> usize {
        let mut count = 0;
        for seg in &self.segs {
            if count == iov.len() {
                break;
            }
            match seg {
                Segment::Bytes { buf, pos } if *pos < buf.len() => {
                    iov[count] = iovec(&buf[*pos..]);
                    count += 1;
                }
                Segment::Bytes { .. } => {}
                Segment::File { .. } => break,
            }
        }
        count
    }

    /// Drops `n` written bytes from the front buffer segments.
    fn consume(&mut self, mut n: usize) {
        self.pending -= n;
        while let Some(Segment::Bytes { buf, pos }) = self.segs.front_mut() {
            let left = buf.len() - *pos;
            if n < left {
                *pos += n;
                return;
            }
            n -= left;
            let Some(Segment::Bytes { mut buf, .. }) = self.segs.pop_front() else {
                unreachable!("front was a bytes segment")
            };
            if buf.capacity() > self.spare.capacity() && buf.capacity() <= 1 << 20 {
                buf.clear();
                self.spare = buf;
            }
            if n == 0 && !matches!(self.segs.front(), Some(Segment::Bytes { .. })) {
                return;
            }
        }
    }

    /// Hands up to `max` queued bytes, front first, to `sink` instead of a socket (a TLS
    /// session encrypts them): buffers are passed as they are, file ranges read with `pread`
    /// into `scratch`. `sink` returns how many of the bytes it took; those leave the queue, and
    /// a sink that takes fewer than it was given ends the call. Returns the bytes taken.
    pub fn drain_to(
        &mut self,
        max: usize,
        scratch: &mut Vec<u8>,
        sink: &mut dyn FnMut(&[u8]) -> io::Result<usize>,
    ) -> io::Result<usize> {
        let mut taken = 0;
        while taken < max {
            let Some(seg) = self.segs.front_mut() else {
                break;
            };
            let room = max - taken;
            let (given, took) = match seg {
                Segment::Bytes { buf, pos } => {
                    let data = &buf[*pos..];
                    if data.is_empty() {
                        self.consume(0);
                        continue;
                    }
                    let data = &data[..data.len().min(room)];
                    (data.len(), sink(data)?)
                }
                Segment::File {
                    file,
                    offset,
                    remaining,
                } => {
                    let want = (*remaining).min(room as u64) as usize;
                    scratch.clear();
                    scratch.reserve(want);
                    // SAFETY: `pread` writes at most `want` bytes into the spare capacity just
                    // reserved; the length is set to what it wrote below.
                    let r = cvt(unsafe {
                        libc::pread(
                            file.as_raw_fd(),
                            scratch.as_mut_ptr().cast(),
                            want,
                            *offset as libc::off_t,
                        )
                    });
                    let n = match r {
                        Ok(0) => {
                            return Err(io::Error::new(
                                io::ErrorKind::UnexpectedEof,
                                "file shrank while being sent",
                            ))
                        }
                        Ok(n) => n as usize,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => return Err(e),
                    };
                    // SAFETY: the kernel initialized `n` bytes of the reserved capacity.
                    unsafe { scratch.set_len(n) };
                    let took = sink(scratch)?;
                    let took64 = took as u64;
                    *offset += took64;
                    *remaining -= took64;
                    self.pending -= took;
                    if *remaining == 0 {
                        self.segs.pop_front();
                    }
                    taken += took;
                    if took < n {
                        break;
                    }
                    continue;
                }
            };
            self.consume(took);
            taken += took;
            if took < given {
                break;
            }
        }
        Ok(taken)
    }

    /// Forgets everything queued (the connection is gone).
    pub fn clear(&mut self) {
        self.segs.clear();
        self.pending = 0;
    }
}

/// `flush_with` on an empty queue: `extra` written once (retried on `EINTR`); a full socket
/// buffer writes nothing.
fn write_extra(call: WriteCall, fd: RawFd, extra: &[u8]) -> io::Result<usize> {
    if extra.is_empty() {
        return Ok(0);
    }
    loop {
        match call.write_one(fd, extra) {
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(0),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

const EMPTY_IOVEC: libc::iovec = libc::iovec {
    iov_base: std::ptr::null_mut(),
    iov_len: 0,
};

fn iovec(data: &[u8]) -> libc::iovec {
    libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    }
}

/// `sendmsg`, or plain `send` for one buffer (a response whose head and small body were queued
/// together, a flush of one queued buffer), which spares the kernel the `msghdr` and iovec
/// copies: about 300 ns per call on this machine's loopback (`benchmarks/http/send_shape.c`:
/// 1.83-1.98 µs per two-buffer `sendmsg` of 153 bytes, 1.53-1.61 µs per `send`).
fn sendmsg(fd: RawFd, iov: &[libc::iovec]) -> io::Result<usize> {
    if let [one] = iov {
        // SAFETY: `one` points into a live buffer of `iov_len` bytes for this call.
        let r = unsafe { libc::send(fd, one.iov_base, one.iov_len, libc::MSG_NOSIGNAL) };
        return cvt(r).map(|n| n as usize);
    }
    // SAFETY: an all-zero msghdr is valid (no name, no control data).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_ptr().cast_mut();
    msg.msg_iovlen = iov.len() as _;
    // SAFETY: `msg` points at `iov`, whose entries point into live buffers for this call.
    cvt(unsafe { libc::sendmsg(fd, &raw const msg, libc::MSG_NOSIGNAL) }).map(|n| n as usize)
}

/// `writev`, or plain `write` for one buffer (the usual case: a `write()` with nothing queued),
/// which spares the kernel copying and checking the iovec array (about 5% of a 1 KiB pipe echo's
/// samples under perf, `import_iovec` and `copy_iovec_from_user`).
fn writev(fd: RawFd, iov: &[libc::iovec]) -> io::Result<usize> {
    if let [one] = iov {
        // SAFETY: `one` points into a live buffer of `iov_len` bytes for this call.
        return cvt(unsafe { libc::write(fd, one.iov_base, one.iov_len) }).map(|n| n as usize);
    }
    // SAFETY: the entries of `iov` point into live buffers for this call, and `iov.len()` is at
    // most `MAX_IOVECS`, well under `IOV_MAX`.
    cvt(unsafe { libc::writev(fd, iov.as_ptr(), iov.len() as libc::c_int) }).map(|n| n as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::fd::FromRawFd;
    use std::os::unix::net::UnixStream;

    fn pair() -> (UnixStream, UnixStream) {
        let (a, b) = UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        (a, b)
    }

    #[test]
    fn queued_bytes_then_extra_arrive_in_order() {
        let (a, mut b) = pair();
        let mut q = OutQueue::new();
        q.push(b"head ");
        q.with_tail(|buf| buf.extend_from_slice(b"more "));
        assert_eq!(q.pending(), 10);
        let n = q.flush_with(a.as_raw_fd(), b"body").unwrap();
        assert_eq!(n, 4);
        assert!(q.is_empty());
        drop(a);
        let mut got = Vec::new();
        b.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"head more body");
    }

    /// Flushes `q` into `writer` until it is empty while a thread reads `reader` to EOF (the
    /// writer is closed after the flush); returns what the thread read.
    fn flush_while_reading(
        q: &mut OutQueue,
        writer: impl AsRawFd,
        mut reader: impl Read + Send + 'static,
    ) -> Vec<u8> {
        let thread = std::thread::spawn(move || {
            let mut got = Vec::new();
            reader.read_to_end(&mut got).unwrap();
            got
        });
        while q.flush(writer.as_raw_fd()).unwrap() == Flushed::Blocked {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        drop(writer);
        thread.join().unwrap()
    }

    #[test]
    fn full_socket_blocks_and_resumes_without_loss() {
        let (a, b) = pair();
        let mut q = OutQueue::new();
        let big: Vec<u8> = (0..4_000_000u32).map(|i| (i % 251) as u8).collect();
        let n = q.flush_with(a.as_raw_fd(), &big).unwrap();
        assert!(
            n < big.len(),
            "a socketpair buffer cannot take 4 MB at once"
        );
        q.push(&big[n..]);
        q.push(b"tail");
        let got = flush_while_reading(&mut q, a, b);
        assert_eq!(got.len(), big.len() + 4);
        assert_eq!(&got[..big.len()], &big[..]);
        assert_eq!(&got[big.len()..], b"tail");
    }

    /// An open, already unlinked file holding `contents`.
    fn temp_file(name: &str, contents: &[u8]) -> OwnedFd {
        let path = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
        std::fs::write(&path, contents).unwrap();
        let f = std::fs::File::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        OwnedFd::from(f)
    }

    #[test]
    fn file_ranges_are_sent_in_order_with_bytes() {
        let owned = temp_file("outq", b"0123456789");
        let (a, mut b) = pair();
        let mut q = OutQueue::new();
        q.push(b"<");
        q.push_file(owned, 2, 5);
        q.push(b">");
        assert_eq!(q.pending(), 7);
        assert_eq!(q.flush(a.as_raw_fd()).unwrap(), Flushed::Done);
        drop(a);
        let mut got = Vec::new();
        b.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"<23456>");
    }

    #[test]
    fn drain_to_hands_bytes_and_file_ranges_in_order_within_max() {
        let owned = temp_file("outq-drain", b"0123456789");
        let mut q = OutQueue::new();
        q.push(b"<ab");
        q.push_file(owned, 2, 5);
        q.push(b">");
        let mut scratch = Vec::new();
        let mut got = Vec::new();
        let mut sink = |b: &[u8]| {
            got.extend_from_slice(b);
            Ok(b.len())
        };
        // `max` splits the file range: 3 buffered bytes and 2 of the file.
        assert_eq!(q.drain_to(5, &mut scratch, &mut sink).unwrap(), 5);
        assert_eq!(q.pending(), 4);
        assert_eq!(q.drain_to(100, &mut scratch, &mut sink).unwrap(), 4);
        assert!(q.is_empty());
        assert_eq!(got, b"<ab23456>");
    }

    #[test]
    fn drain_to_stops_where_the_sink_stops_and_keeps_the_rest() {
        let mut q = OutQueue::new();
        q.push(b"hello world");
        let mut scratch = Vec::new();
        let mut got = Vec::new();
        let took = q
            .drain_to(100, &mut scratch, &mut |b: &[u8]| {
                got.extend_from_slice(&b[..4]);
                Ok(4)
            })
            .unwrap();
        assert_eq!((took, &got[..]), (4, &b"hell"[..]));
        assert_eq!(q.pending(), 7);
        let (a, mut b) = pair();
        assert_eq!(q.flush(a.as_raw_fd()).unwrap(), Flushed::Done);
        drop(a);
        let mut rest = Vec::new();
        b.read_to_end(&mut rest).unwrap();
        assert_eq!(rest, b"o world");
    }

    /// A pipe whose write end is non-blocking (the reader thread blocks).
    fn nonblocking_pipe() -> (OwnedFd, std::fs::File) {
        let mut fds = [0; 2];
        // SAFETY: `fds` is a valid out-array of two ints.
        cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }).unwrap();
        // SAFETY: `fds[1]` is the write end just created; only its own flags change.
        cvt(unsafe { libc::fcntl(fds[1], libc::F_SETFL, libc::O_NONBLOCK) }).unwrap();
        // SAFETY: pipe2 just returned these two fds, owned by nobody else.
        unsafe {
            (
                OwnedFd::from_raw_fd(fds[1]),
                std::fs::File::from_raw_fd(fds[0]),
            )
        }
    }

    #[test]
    fn a_pipe_queue_writes_with_writev_until_the_pipe_is_full() {
        let (w, r) = nonblocking_pipe();
        let mut q = OutQueue::with_call(WriteCall::WriteV);
        q.push(b"head ");
        let big = vec![7u8; 1 << 20];
        let n = q.flush_with(w.as_raw_fd(), &big).unwrap();
        assert!(n < big.len(), "a pipe cannot take 1 MiB at once");
        assert!(q.is_empty(), "the queued head goes out first");
        q.push(&big[n..]);
        let got = flush_while_reading(&mut q, w, r);
        assert_eq!(&got[..5], b"head ");
        assert_eq!(got.len(), 5 + big.len());
    }

    #[test]
    fn closed_peer_is_an_error_not_a_signal() {
        let (a, b) = pair();
        drop(b);
        let mut q = OutQueue::new();
        q.push(b"x");
        let err = q.flush(a.as_raw_fd()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
    }
}
