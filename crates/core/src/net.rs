//! Socket calls the server makes on accepted connections, in one place: `accept4` with the
//! peer's address, and the few options and reads around it.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use crate::handoff::Peer;
use crate::sys::cvt;

/// `accept4` non-blocking and close-on-exec; `Ok(None)` when no connection waits. TCP
/// connections get `TCP_NODELAY` (responses are written whole; Nagle would only delay them).
pub fn accept(listen_fd: RawFd) -> io::Result<Option<(OwnedFd, Peer)>> {
    // SAFETY: a zeroed sockaddr_storage is a valid out-buffer for any address family.
    let mut addr: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: `addr`/`len` describe a writable buffer of the stated size.
    let fd = match cvt(unsafe {
        libc::accept4(
            listen_fd,
            (&raw mut addr).cast(),
            &raw mut len,
            libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
        )
    }) {
        Ok(fd) => fd,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
        Err(e) => return Err(e),
    };
    // SAFETY: accept4 succeeded, so `fd` is a new descriptor owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let peer = match i32::from(addr.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let a: &libc::sockaddr_in = unsafe { &*(&raw const addr).cast() };
            let ip = Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
            Peer::Inet(IpAddr::V4(ip), u16::from_be(a.sin_port))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let a: &libc::sockaddr_in6 = unsafe { &*(&raw const addr).cast() };
            let ip = Ipv6Addr::from(a.sin6_addr.s6_addr);
            Peer::Inet(IpAddr::V6(ip), u16::from_be(a.sin6_port))
        }
        _ => Peer::None,
    };
    if matches!(peer, Peer::Inet(..)) {
        set_nodelay(&fd);
    }
    Ok(Some((fd, peer)))
}

fn set_nodelay(fd: &OwnedFd) {
    use std::os::fd::AsRawFd;
    let one: libc::c_int = 1;
    // SAFETY: `one` outlives the call and its size is passed; failure is harmless (a peer
    // already gone) and ignored.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            (&raw const one).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// Makes `fd` non-blocking (`O_NONBLOCK`), whatever its opener chose.
pub fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on an fd the caller owns; no memory is passed.
    let flags = cvt(unsafe { libc::fcntl(fd, libc::F_GETFL) })?;
    if flags & libc::O_NONBLOCK == 0 {
        // SAFETY: as above.
        cvt(unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) })?;
    }
    Ok(())
}

/// One non-blocking `recv` into `buf`: `Ok(Some(0))` at end of stream, `Ok(None)` when
/// nothing waits.
pub fn recv(fd: RawFd, buf: &mut [u8]) -> io::Result<Option<usize>> {
    // SAFETY: `buf` is writable for its length.
    match cvt(unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) }) {
        Ok(n) => Ok(Some(n as usize)),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(None),
        Err(e) => Err(e),
    }
}

/// One non-blocking `send` of `data`; how much the socket took (`0` when full).
pub fn send(fd: RawFd, data: &[u8]) -> io::Result<usize> {
    // SAFETY: `data` is readable for its length; MSG_NOSIGNAL turns a gone peer into EPIPE.
    match cvt(unsafe {
        libc::send(
            fd,
            data.as_ptr().cast(),
            data.len(),
            libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
        )
    }) {
        Ok(n) => Ok(n as usize),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
        Err(e) => Err(e),
    }
}

/// Shuts the write side (`SHUT_WR`): the peer reads end of stream after what was sent.
pub fn shutdown_write(fd: RawFd) -> io::Result<()> {
    // SAFETY: shutdown on a socket fd the caller owns; no memory is passed.
    cvt(unsafe { libc::shutdown(fd, libc::SHUT_WR) }).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn accept_reports_the_peer_and_none_when_empty() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        assert!(accept(listener.as_raw_fd()).unwrap().is_none());
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (fd, peer) = loop {
            if let Some(got) = accept(listener.as_raw_fd()).unwrap() {
                break got;
            }
        };
        let local = client.local_addr().unwrap();
        assert_eq!(peer, Peer::Inet(local.ip(), local.port()));
        assert_eq!(send(fd.as_raw_fd(), b"ok").unwrap(), 2);
        let mut buf = [0u8; 8];
        let mut client = client;
        let n = std::io::Read::read(&mut client, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"ok");
        drop(client);
        // The peer's close reads as end of stream.
        let mut got = None;
        while got.is_none() {
            got = recv(fd.as_raw_fd(), &mut buf).unwrap();
        }
        assert_eq!(got, Some(0));
    }
}
