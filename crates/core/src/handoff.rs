//! Handing an open connection from one process to another: its fd (`SCM_RIGHTS`) with the
//! bytes already read from it, over a `SOCK_SEQPACKET` Unix socket (a "channel").
//!
//! The dispatching front and each worker share one channel. The front sends `Conn` (a
//! connection whose request head it has read); the worker answers, for each of them, either
//! `Return` (the response is written and the connection is idle: here it is back, with any
//! bytes of the next request already read) or `Done` (the worker closed it, or keeps it for
//! good, as a WebSocket).
//!
//! Wire format: every datagram starts with a fixed [`HEADER_LEN`]-byte header; a `Conn` or
//! `Return` carries the fd and at most [`PART_MAX`] bytes of data, and the rest of its data
//! follows in `More` datagrams sent right behind it. A seqpacket socket keeps datagrams in
//! order and whole, so the receiver needs no framing beyond the header.
//!
//! Invariants:
//! - An fd is attached only to the first datagram of a `Conn` or `Return`; the receiver closes
//!   any fd that arrives on another datagram, so a confused peer cannot leak descriptors here.
//! - [`ChannelOut`] sends datagrams strictly in push order and owns each fd until the
//!   datagram carrying it is sent (then the kernel holds a copy and ours is closed).
//! - [`ChannelIn`] yields a message only once all its data has arrived.

use std::collections::VecDeque;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use crate::sys::{cvt, cvt_retry};

/// Bytes of the fixed header of every datagram.
pub const HEADER_LEN: usize = 40;
/// Data bytes carried by one datagram at most. Well under the default socket buffer (about
/// 200 KiB), so a datagram always fits once the peer has read the ones before it.
pub const PART_MAX: usize = 32 * 1024;

/// What a datagram is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Front → worker: a connection (fd attached) and the bytes read from it.
    Conn,
    /// Worker → front: the connection is idle again (fd attached), with unread bytes.
    Return,
    /// Worker → front: the worker has finished with the connection (closed or kept).
    Done,
    /// The next part of the data of the `Conn` or `Return` before it.
    More,
}

impl Kind {
    fn to_byte(self) -> u8 {
        match self {
            Kind::Conn => 1,
            Kind::Return => 2,
            Kind::Done => 3,
            Kind::More => 4,
        }
    }

    fn from_byte(b: u8) -> Option<Self> {
        Some(match b {
            1 => Kind::Conn,
            2 => Kind::Return,
            3 => Kind::Done,
            4 => Kind::More,
            _ => return None,
        })
    }
}

/// A connection's peer, as the front saw it at `accept`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    Inet(IpAddr, u16),
    /// A Unix socket (or an address family the server does not report).
    None,
}

/// One whole message from a channel.
#[derive(Debug)]
pub struct Message {
    pub kind: Kind,
    /// The front's name for the connection; echoed back in `Return` and `Done`.
    pub token: u64,
    /// Which of the front's listeners accepted the connection (its index).
    pub listener: u8,
    pub peer: Peer,
    /// A small number the sender gives a `Done` (what became of the connection).
    pub detail: u8,
    pub fd: Option<OwnedFd>,
    pub data: Vec<u8>,
}

impl Message {
    /// A `Conn` or `Return` message.
    pub fn conn(
        kind: Kind,
        token: u64,
        listener: u8,
        peer: Peer,
        fd: OwnedFd,
        data: Vec<u8>,
    ) -> Self {
        Self {
            kind,
            token,
            listener,
            peer,
            detail: 0,
            fd: Some(fd),
            data,
        }
    }

    /// A `Done` message.
    pub fn done(token: u64, detail: u8) -> Self {
        Self {
            kind: Kind::Done,
            token,
            listener: 0,
            peer: Peer::None,
            detail,
            fd: None,
            data: Vec::new(),
        }
    }
}

fn encode_header(
    kind: Kind,
    token: u64,
    listener: u8,
    peer: Peer,
    detail: u8,
    total: usize,
) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[0] = kind.to_byte();
    h[1] = listener;
    h[3] = detail;
    h[4..8].copy_from_slice(&(total as u32).to_le_bytes());
    h[8..16].copy_from_slice(&token.to_le_bytes());
    match peer {
        Peer::Inet(IpAddr::V4(ip), port) => {
            h[2] = 4;
            h[16..18].copy_from_slice(&port.to_le_bytes());
            h[24..28].copy_from_slice(&ip.octets());
        }
        Peer::Inet(IpAddr::V6(ip), port) => {
            h[2] = 6;
            h[16..18].copy_from_slice(&port.to_le_bytes());
            h[24..40].copy_from_slice(&ip.octets());
        }
        Peer::None => {}
    }
    h
}

struct DecodedHeader {
    kind: Kind,
    token: u64,
    listener: u8,
    peer: Peer,
    detail: u8,
    total: usize,
}

fn decode_header(h: &[u8]) -> Option<DecodedHeader> {
    if h.len() < HEADER_LEN {
        return None;
    }
    let kind = Kind::from_byte(h[0])?;
    let total = u32::from_le_bytes(h[4..8].try_into().ok()?) as usize;
    let token = u64::from_le_bytes(h[8..16].try_into().ok()?);
    let port = u16::from_le_bytes(h[16..18].try_into().ok()?);
    let peer = match h[2] {
        4 => Peer::Inet(
            IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(&h[24..28]).ok()?)),
            port,
        ),
        6 => Peer::Inet(
            IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&h[24..40]).ok()?)),
            port,
        ),
        _ => Peer::None,
    };
    Some(DecodedHeader {
        kind,
        token,
        listener: h[1],
        peer,
        detail: h[3],
        total,
    })
}

/// The sending side of a channel: messages queued in order, sent as far as the socket takes.
#[derive(Default)]
pub struct ChannelOut {
    queue: VecDeque<Message>,
    /// Datagrams of the first message already sent (its first carried the fd).
    sent_parts: usize,
}

impl ChannelOut {
    pub fn new() -> Self {
        Self::default()
    }

    /// Nothing waits to be sent.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Queues `msg`; call [`ChannelOut::flush`] to send.
    pub fn push(&mut self, msg: Message) {
        self.queue.push_back(msg);
    }

    /// Sends queued datagrams until the queue is empty (`Ok(true)`) or the socket is full
    /// (`Ok(false)`: wait until `chan` is writable). An error means the peer is gone: the
    /// messages not yet begun are still here ([`ChannelOut::take_unsent`]).
    pub fn flush(&mut self, chan: RawFd) -> io::Result<bool> {
        while let Some(msg) = self.queue.front() {
            let parts = msg.data.len().div_ceil(PART_MAX).max(1);
            while self.sent_parts < parts {
                let part = self.sent_parts;
                let range = part * PART_MAX..((part + 1) * PART_MAX).min(msg.data.len());
                let (header, fd) = if part == 0 {
                    let header = encode_header(
                        msg.kind,
                        msg.token,
                        msg.listener,
                        msg.peer,
                        msg.detail,
                        msg.data.len(),
                    );
                    (header, msg.fd.as_ref().map(AsRawFd::as_raw_fd))
                } else {
                    (
                        encode_header(Kind::More, msg.token, 0, Peer::None, 0, 0),
                        None,
                    )
                };
                // Header and bytes go out as two pieces of one datagram: no copy of the bytes.
                match send_datagram_parts(chan, &header, &msg.data[range], fd) {
                    Ok(()) => self.sent_parts += 1,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                    Err(e) => return Err(e),
                }
            }
            // The kernel holds its own reference to the file now; ours closes here.
            self.queue.pop_front();
            self.sent_parts = 0;
        }
        Ok(true)
    }

    /// The messages of which nothing was sent, in order (the peer is gone: they can go
    /// elsewhere); a message sent in part is dropped.
    pub fn take_unsent(&mut self) -> Vec<Message> {
        if self.sent_parts > 0 {
            self.queue.pop_front();
            self.sent_parts = 0;
        }
        self.queue.drain(..).collect()
    }
}

/// Space for one `SCM_RIGHTS` control message with one fd, aligned for `cmsghdr`.
#[repr(C)]
union CmsgSpace {
    _align: libc::cmsghdr,
    bytes: [u8; 64],
}

/// Sends one datagram, with `fd` attached if given (the front's control socket is written
/// with this directly).
pub fn send_datagram(chan: RawFd, bytes: &[u8], fd: Option<RawFd>) -> io::Result<()> {
    send_datagram_parts(chan, bytes, &[], fd)
}

/// Sends `head` then `rest` as one datagram (two iovecs), with `fd` attached if given.
fn send_datagram_parts(chan: RawFd, head: &[u8], rest: &[u8], fd: Option<RawFd>) -> io::Result<()> {
    let mut iov = [
        libc::iovec {
            iov_base: head.as_ptr() as *mut libc::c_void,
            iov_len: head.len(),
        },
        libc::iovec {
            iov_base: rest.as_ptr() as *mut libc::c_void,
            iov_len: rest.len(),
        },
    ];
    let pieces = if rest.is_empty() { 1 } else { 2 };
    let mut cmsg = CmsgSpace { bytes: [0; 64] };
    // SAFETY: a zeroed msghdr is a valid "no name, no control" header; the fields set below
    // point at `iov` and `cmsg`, which outlive the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = pieces;
    if let Some(fd) = fd {
        // SAFETY: CMSG_SPACE/CMSG_LEN only compute sizes.
        let (space, len) = unsafe {
            (
                libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32),
                libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32),
            )
        };
        msg.msg_control = (&raw mut cmsg).cast();
        msg.msg_controllen = space as usize;
        // SAFETY: `msg_control` points at `cmsg`, which is aligned for `cmsghdr` and at least
        // `space` bytes long, so CMSG_FIRSTHDR is non-null and its data area holds one fd.
        unsafe {
            let hdr = libc::CMSG_FIRSTHDR(&raw const msg);
            (*hdr).cmsg_level = libc::SOL_SOCKET;
            (*hdr).cmsg_type = libc::SCM_RIGHTS;
            (*hdr).cmsg_len = len as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(hdr).cast::<RawFd>(), fd);
        }
    }
    // SAFETY: `msg` describes live buffers (above); MSG_NOSIGNAL turns a gone peer into EPIPE.
    let sent = cvt_retry(|| unsafe {
        libc::sendmsg(
            chan,
            &raw const msg,
            libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
        )
    })?;
    if sent as usize != head.len() + rest.len() {
        // A seqpacket datagram is sent whole or not at all.
        return Err(io::Error::other("channel datagram sent in part"));
    }
    Ok(())
}

/// A datagram as received: its length in `buf` and the fd it carried, if any; `Ok(None)` when
/// none waits. The front's control channel reads its datagrams with this directly.
pub fn recv_datagram(chan: RawFd, buf: &mut [u8]) -> io::Result<Option<(usize, Option<OwnedFd>)>> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut cmsg = CmsgSpace { bytes: [0; 64] };
    // SAFETY: as in `send_datagram`: a zeroed msghdr pointing at live buffers.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = (&raw mut cmsg).cast();
    msg.msg_controllen = std::mem::size_of::<CmsgSpace>();
    // SAFETY: `msg` describes writable buffers of the stated sizes that outlive the call.
    let n = match cvt_retry(|| unsafe {
        libc::recvmsg(
            chan,
            &raw mut msg,
            libc::MSG_CMSG_CLOEXEC | libc::MSG_DONTWAIT,
        )
    }) {
        Ok(n) => n as usize,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut fd = None;
    // SAFETY: the kernel filled `msg_control`/`msg_controllen`; CMSG_FIRSTHDR/NXTHDR walk
    // only within them, and an SCM_RIGHTS message's data holds whole fds that are now ours.
    unsafe {
        let mut hdr = libc::CMSG_FIRSTHDR(&raw const msg);
        while !hdr.is_null() {
            if (*hdr).cmsg_level == libc::SOL_SOCKET && (*hdr).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(hdr);
                let count =
                    ((*hdr).cmsg_len - libc::CMSG_LEN(0) as usize) / std::mem::size_of::<RawFd>();
                for i in 0..count {
                    let at = data.add(i * std::mem::size_of::<RawFd>());
                    let raw = std::ptr::read_unaligned(at.cast::<RawFd>());
                    let owned = OwnedFd::from_raw_fd(raw);
                    // One fd per datagram; any other is closed as it drops.
                    if fd.is_none() {
                        fd = Some(owned);
                    }
                }
            }
            hdr = libc::CMSG_NXTHDR(&raw const msg, hdr);
        }
    }
    if n == 0 && fd.is_none() {
        return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
    }
    if msg.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0 {
        return Err(io::Error::other("channel datagram truncated"));
    }
    Ok(Some((n, fd)))
}

/// The receiving side of a channel: reassembles messages from datagrams.
pub struct ChannelIn {
    buf: Vec<u8>,
    /// A `Conn` or `Return` whose data has not all arrived, and how much is missing.
    partial: Option<(Message, usize)>,
}

impl Default for ChannelIn {
    fn default() -> Self {
        Self {
            buf: vec![0; HEADER_LEN + PART_MAX],
            partial: None,
        }
    }
}

impl ChannelIn {
    pub fn new() -> Self {
        Self::default()
    }

    /// The next whole message, `Ok(None)` when the channel has nothing more for now. An error
    /// means the channel is broken (the peer is gone, `UnexpectedEof`, or it sent garbage).
    pub fn recv(&mut self, chan: RawFd) -> io::Result<Option<Message>> {
        loop {
            let Some((n, fd)) = recv_datagram(chan, &mut self.buf)? else {
                return Ok(None);
            };
            let bad = || io::Error::new(io::ErrorKind::InvalidData, "bad channel datagram");
            let h = decode_header(&self.buf[..n]).ok_or_else(bad)?;
            let data = &self.buf[HEADER_LEN..n];
            if h.kind == Kind::More {
                drop(fd);
                let (mut msg, missing) = self.partial.take().ok_or_else(bad)?;
                if data.len() > missing || msg.token != h.token {
                    return Err(bad());
                }
                msg.data.extend_from_slice(data);
                if missing == data.len() {
                    return Ok(Some(msg));
                }
                self.partial = Some((msg, missing - data.len()));
                continue;
            }
            if self.partial.is_some() || data.len() > h.total {
                return Err(bad());
            }
            let has_fd = matches!(h.kind, Kind::Conn | Kind::Return);
            if has_fd != fd.is_some() {
                return Err(bad());
            }
            let mut msg = Message {
                kind: h.kind,
                token: h.token,
                listener: h.listener,
                peer: h.peer,
                detail: h.detail,
                fd,
                data: Vec::with_capacity(h.total),
            };
            msg.data.extend_from_slice(data);
            if msg.data.len() == h.total {
                return Ok(Some(msg));
            }
            self.partial = Some((msg, h.total - data.len()));
        }
    }
}

/// A connected pair of non-blocking, close-on-exec seqpacket sockets.
pub fn channel_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` has room for the two descriptors socketpair writes.
    cvt(unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    })?;
    // SAFETY: socketpair succeeded, so both fds are open and now owned here.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn pipe() -> (OwnedFd, OwnedFd) {
        let mut fds = [0 as RawFd; 2];
        // SAFETY: `fds` has room for two descriptors.
        cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }).unwrap();
        // SAFETY: pipe2 succeeded; both fds are ours.
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
    }

    fn write_all(fd: &OwnedFd, data: &[u8]) {
        // SAFETY: `data` is a live buffer of the stated length.
        let n = unsafe { libc::write(fd.as_raw_fd(), data.as_ptr().cast(), data.len()) };
        assert_eq!(n as usize, data.len());
    }

    fn read_some(fd: &OwnedFd) -> Vec<u8> {
        let mut buf = [0u8; 64];
        // SAFETY: `buf` is writable for its length.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        buf[..n as usize].to_vec()
    }

    fn roundtrip(data: Vec<u8>, peer: Peer) {
        let (a, b) = channel_pair().unwrap();
        let (r, w) = pipe();
        let mut out = ChannelOut::new();
        out.push(Message::conn(Kind::Conn, 7, 2, peer, w, data.clone()));
        let mut inp = ChannelIn::new();
        let mut got = None;
        // Sending and receiving alternate, as a full socket buffer would make them.
        while got.is_none() {
            let _ = out.flush(a.as_raw_fd()).unwrap();
            got = inp.recv(b.as_raw_fd()).unwrap();
        }
        assert!(out.is_empty());
        let msg = got.unwrap();
        assert_eq!(msg.kind, Kind::Conn);
        assert_eq!((msg.token, msg.listener, msg.peer), (7, 2, peer));
        assert_eq!(msg.data, data);
        // The fd that arrived is the pipe's write end: what we write through it comes out of
        // the read end we kept.
        write_all(msg.fd.as_ref().unwrap(), b"hi");
        assert_eq!(read_some(&r), b"hi");
        assert!(inp.recv(b.as_raw_fd()).unwrap().is_none());
    }

    #[test]
    fn a_connection_crosses_with_its_bytes() {
        let v4 = Peer::Inet(IpAddr::V4(Ipv4Addr::LOCALHOST), 5000);
        roundtrip(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), v4);
        roundtrip(Vec::new(), Peer::None);
        let v6 = Peer::Inet(IpAddr::V6(Ipv6Addr::LOCALHOST), 65535);
        roundtrip(vec![b'x'; PART_MAX], v6);
    }

    #[test]
    fn data_larger_than_a_part_is_reassembled() {
        let data: Vec<u8> = (0..PART_MAX * 3 + 17).map(|i| (i % 251) as u8).collect();
        roundtrip(data, Peer::None);
    }

    #[test]
    fn done_carries_no_fd_and_order_is_kept() {
        let (a, b) = channel_pair().unwrap();
        let mut out = ChannelOut::new();
        out.push(Message::done(1, 3));
        let (_r, w) = pipe();
        out.push(Message::conn(
            Kind::Return,
            2,
            0,
            Peer::None,
            w,
            b"next".to_vec(),
        ));
        out.push(Message::done(3, 0));
        assert!(out.flush(a.as_raw_fd()).unwrap());
        let mut inp = ChannelIn::new();
        let m1 = inp.recv(b.as_raw_fd()).unwrap().unwrap();
        let m2 = inp.recv(b.as_raw_fd()).unwrap().unwrap();
        let m3 = inp.recv(b.as_raw_fd()).unwrap().unwrap();
        assert_eq!(
            (m1.kind, m1.token, m1.detail, m1.fd.is_none()),
            (Kind::Done, 1, 3, true)
        );
        assert_eq!(
            (m2.kind, m2.token, m2.data.as_slice()),
            (Kind::Return, 2, &b"next"[..])
        );
        assert!(m2.fd.is_some());
        assert_eq!((m3.kind, m3.token), (Kind::Done, 3));
    }

    #[test]
    fn a_full_channel_keeps_the_rest_queued() {
        let (a, b) = channel_pair().unwrap();
        let mut out = ChannelOut::new();
        let mut sent = 0;
        // Queue far more than the socket buffer holds.
        for token in 0..64 {
            out.push(Message::conn(
                Kind::Conn,
                token,
                0,
                Peer::None,
                pipe().1,
                vec![0u8; PART_MAX],
            ));
            sent += 1;
        }
        assert!(
            !out.flush(a.as_raw_fd()).unwrap(),
            "the socket buffer should fill"
        );
        let mut inp = ChannelIn::new();
        let mut tokens = Vec::new();
        while tokens.len() < sent {
            let _ = out.flush(a.as_raw_fd()).unwrap();
            while let Some(m) = inp.recv(b.as_raw_fd()).unwrap() {
                tokens.push(m.token);
            }
        }
        assert_eq!(tokens, (0..64).collect::<Vec<_>>());
    }

    #[test]
    fn messages_not_sent_to_a_gone_peer_come_back_whole() {
        let (a, b) = channel_pair().unwrap();
        drop(b);
        let mut out = ChannelOut::new();
        out.push(Message::conn(
            Kind::Conn,
            1,
            0,
            Peer::None,
            pipe().1,
            vec![7; 10],
        ));
        out.push(Message::done(2, 0));
        assert!(out.flush(a.as_raw_fd()).is_err());
        let back = out.take_unsent();
        assert_eq!(back.len(), 2);
        assert_eq!((back[0].token, back[0].data.len()), (1, 10));
        assert!(back[0].fd.is_some());
        assert!(out.is_empty());
    }

    #[test]
    fn a_closed_peer_is_an_error_not_a_message() {
        let (a, b) = channel_pair().unwrap();
        drop(a);
        let mut inp = ChannelIn::new();
        let err = inp.recv(b.as_raw_fd()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        let mut out = ChannelOut::new();
        out.push(Message::done(1, 0));
        let (c, d) = channel_pair().unwrap();
        drop(d);
        assert!(out.flush(c.as_raw_fd()).is_err());
        let _ = b.as_fd();
    }

    #[test]
    fn garbage_is_refused() {
        let (a, b) = channel_pair().unwrap();
        // A `More` with nothing before it, then a header of an unknown kind.
        let more = encode_header(Kind::More, 1, 0, Peer::None, 0, 0);
        send_datagram(a.as_raw_fd(), &more, None).unwrap();
        let mut inp = ChannelIn::new();
        assert_eq!(
            inp.recv(b.as_raw_fd()).unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
        let mut unknown = [0u8; HEADER_LEN];
        unknown[0] = 99;
        send_datagram(a.as_raw_fd(), &unknown, None).unwrap();
        assert!(inp.recv(b.as_raw_fd()).is_err());
        // A `Conn` without its fd.
        let conn = encode_header(Kind::Conn, 1, 0, Peer::None, 0, 0);
        send_datagram(a.as_raw_fd(), &conn, None).unwrap();
        assert!(inp.recv(b.as_raw_fd()).is_err());
    }
}
