//! The HTTP/1.1 codec, sans-IO: bytes in, parsed heads and body runs out, bytes to send back.
//!
//! Nothing here touches a socket, a clock (except [`DateCache`], which reads the wall clock on
//! request) or Python. [`conn::Http1Conn`] owns the read buffer and drives these pieces; the
//! driver (the native module's server) owns the socket and the write buffer:
//!
//! * [`parse_head`] turns the bytes at the front of the read buffer into a [`Head`] of ranges into
//!   that buffer (names lowercased in place), deciding the request's [`BodyKind`] by RFC 9112 §6.
//! * [`BodyDecoder`] strips the body framing (Content-Length or chunked) one contiguous run at a
//!   time and never reads past the end of the body, so a pipelined request behind it stays put.
//! * [`encode_head`] writes the response head and decides the response [`Framing`]; the body
//!   helpers ([`encode_chunk`], [`encode_last_chunk`]) write the chunked framing.
//! * [`error_response`] is the complete response sent before closing on an [`HttpError`].
//! * [`conn::Http1Conn`] is the server connection over these pieces: the read buffer, the
//!   phase and its transition table, pipelining, `Expect: 100-continue` and keep-alive.
//!
//! Invariants for the whole module:
//! * A parser error is final for the connection: the caller sends `error_response(err.status, ..)`
//!   and closes. No function here resumes after returning `Err`.
//! * Feeding a parser its input whole, byte by byte, or followed by a pipelined request gives the
//!   same result, and every consumed count stops exactly at the end of what it describes (the unit
//!   tests check each case all three ways).
//! * Every limit has a default, cites its precedent, and its error message names the option that
//!   raises it.

pub mod body;
pub mod cgi;
pub mod conn;
pub mod date;
pub mod request;
pub mod response;

#[cfg(test)]
mod random_tests;

use std::fmt;

pub use body::{BodyDecoder, Decoded};
pub use cgi::cgi_key;
pub use date::{format_http_date, DateCache};
pub use request::{parse_head, BodyKind, Head, Limits};
pub use response::{
    check_response, encode_chunk, encode_head, encode_last_chunk, encode_upgrade_head,
    error_response, reason_phrase, valid_field, write_chunk_size, Framing, HeaderError,
    RequestInfo, ServerFields,
};

/// RFC 9113 §3.4: the first bytes of an HTTP/2 connection with prior knowledge (h2c). The
/// server tells it from an HTTP/1.1 request by them (`crates/py/src/server/http2/`), and the
/// front places such a connection on a worker for its life.
pub const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// How the first bytes of a connection compare with [`H2_PREFACE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Preface {
    /// They are the preface (HTTP/2 with prior knowledge).
    Yes,
    /// They start it but are too few to tell: wait for more.
    Partial,
    /// Anything else (an HTTP/1.1 request).
    No,
}

pub fn h2_preface(input: &[u8]) -> Preface {
    let n = input.len().min(H2_PREFACE.len());
    if input[..n] != H2_PREFACE[..n] {
        Preface::No
    } else if n < H2_PREFACE.len() {
        Preface::Partial
    } else {
        Preface::Yes
    }
}

#[cfg(test)]
mod preface_tests {
    use super::{h2_preface, Preface, H2_PREFACE};

    #[test]
    fn the_h2_preface_is_told_from_http1_at_every_length() {
        for n in 0..H2_PREFACE.len() {
            assert_eq!(h2_preface(&H2_PREFACE[..n]), Preface::Partial, "{n} bytes");
        }
        assert_eq!(h2_preface(H2_PREFACE), Preface::Yes);
        let mut more = H2_PREFACE.to_vec();
        more.extend_from_slice(b"\x00\x00\x00\x04");
        assert_eq!(h2_preface(&more), Preface::Yes);
        assert_eq!(h2_preface(b"GET / HTTP/1.1\r\n"), Preface::No);
        assert_eq!(h2_preface(b"PRI * HTTP/1.1\r\n"), Preface::No);
        assert_eq!(h2_preface(b"POST / HTTP/1.1\r\n"), Preface::No);
    }
}

/// The protocol version of a request. Only HTTP/1.0 and HTTP/1.1 are served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Version {
    Http10,
    #[default]
    Http11,
}

/// A request the server must reject: send `status` with `reason` as the body, then close.
///
/// `reason` names the cause and, for a limit, the option that raises it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpError {
    pub status: u16,
    pub reason: &'static str,
}

impl HttpError {
    pub(crate) const fn new(status: u16, reason: &'static str) -> Self {
        Self { status, reason }
    }
}

/// The answer to a request head not whole within `--timeout-header`: the same whoever holds
/// the connection (a server, or the dispatching front).
pub const HEAD_TIMED_OUT: HttpError = HttpError::new(
    408,
    "request head not received in time; raise --timeout-header",
);

impl fmt::Display for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.status, self.reason)
    }
}

impl std::error::Error for HttpError {}
