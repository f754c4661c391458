//! The permessage-deflate extension (RFC 7692): negotiating it from the client's offers, the
//! server's [`Compressor`], and the inflater the [`Decoder`](super::Decoder) uses for compressed
//! messages.
//!
//! A compressed message is raw DEFLATE (no zlib header) ended by a sync flush, whose trailing
//! empty stored block `00 00 ff ff` is left off on the wire (RFC 7692 §7.2.1); the receiver puts
//! it back before inflating (§7.2.2). Only a message's first frame carries RSV1; the fragments
//! are pieces of the one compressed payload.
//!
//! Who owns what: each side of a connection has its own LZ77 context. The [`Compressor`] (owned by
//! the connection's sending side) keeps the server's across messages unless
//! `server_no_context_takeover` was agreed; the `Inflater` (owned by the decoder) keeps the
//! client's unless `client_no_context_takeover` was agreed. Neither is shared or reset in the
//! middle of a message.
//!
//! Decisions beyond the RFC's MUSTs:
//! * The inflater always uses a 15-bit window: it inflates a stream made with any smaller window,
//!   so `client_max_window_bits` is only echoed, never needed. Its cost per connection is the
//!   32 KiB window and the inflate state (about 7 KiB in zlib).
//! * `server_max_window_bits=8` is declined: zlib (and zlib-rs, which follows it) cannot produce
//!   raw deflate with a 256-byte window; since zlib 1.2.9 it silently uses 9 bits, whose distances
//!   a peer holding only 256 bytes of history could not resolve.
//! * A compressed message with an empty payload is an empty message, and the inflater is left as
//!   it was: a conforming sender's payload is never empty (a sync flush ends with at least the
//!   header bits of its empty stored block), and inflating `00 00 ff ff` alone would leave the
//!   stream inside a stored block, breaking the next message.
//! * A payload ending in a final block (BFINAL, RFC 7692 §7.2.3.4) ends the client's stream: the
//!   next compressed message starts a new one. Bytes after the final block are ignored, as zlib
//!   ignores them (the sender appends an empty stored block after it, §7.2.1, and only its last
//!   4 bytes are left off).
//! * A payload that stops inside a block (the sender did not flush) is not refused by itself:
//!   flate2's API does not tell whether inflate stopped at a block boundary, so, as with zlib in
//!   Python's `websockets`, TAIL is read as more of that block and this or a later message most
//!   likely fails as corrupt. Only the connection of the client that did it is harmed.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::mem;

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

use crate::http::request::trim_ows;

/// The extension's name in `Sec-WebSocket-Extensions`.
const NAME: &[u8] = b"permessage-deflate";

/// The empty stored block that ends a sync flush: left off on the wire, put back to inflate.
const TAIL: [u8; 4] = [0x00, 0x00, 0xff, 0xff];

/// The largest LZ77 window (32 KiB), the default of both sides.
const MAX_WINDOW_BITS: u8 = 15;

/// The smallest window zlib can compress raw deflate with (see the module docs on 8).
const MIN_SERVER_WINDOW_BITS: u8 = 9;

/// Negotiated permessage-deflate parameters (RFC 7692 §7.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeflateParams {
    pub server_no_context_takeover: bool,
    pub client_no_context_takeover: bool,
    /// `server_max_window_bits` as the client offered it (9..=15), the LZ77 window of the
    /// server's compressor, echoed in the answer as RFC 7692 §7.1.2.1 requires; `None`: not
    /// offered, a 15-bit window, nothing to answer.
    pub server_max_window_bits: Option<u8>,
    /// `client_max_window_bits` as answered to the client, if the answer carries it.
    pub client_max_window_bits: Option<u8>,
}

/// The parameters of an offer (RFC 7692 §7.1); any other name declines the offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Param {
    ServerNoContextTakeover,
    ClientNoContextTakeover,
    ServerMaxWindowBits,
    ClientMaxWindowBits,
}

impl Param {
    fn from_name(name: &[u8]) -> Option<Self> {
        match name {
            b"server_no_context_takeover" => Some(Self::ServerNoContextTakeover),
            b"client_no_context_takeover" => Some(Self::ClientNoContextTakeover),
            b"server_max_window_bits" => Some(Self::ServerMaxWindowBits),
            b"client_max_window_bits" => Some(Self::ClientMaxWindowBits),
            _ => None,
        }
    }
}

impl DeflateParams {
    /// The first acceptable `permessage-deflate` offer among the request's
    /// `Sec-WebSocket-Extensions` header values (each value may hold several comma-separated
    /// offers; each offer is `name; param; param=value`, params may be quoted-string per RFC 7692
    /// §7.1 / RFC 6455 §9.1). None if no offer is acceptable.
    ///
    /// An offer is declined (the next one is tried) if it has an unknown or repeated parameter, a
    /// value where none is allowed, a missing or invalid value, or `server_max_window_bits=8`.
    /// Other extensions' offers are skipped. Names are matched exactly, as Python's `websockets`
    /// does.
    pub fn negotiate<'a>(values: impl IntoIterator<Item = &'a [u8]>) -> Option<Self> {
        values
            .into_iter()
            .flat_map(|value| Unquoted::split(value, b','))
            .find_map(Self::accept)
    }

    /// The parameters that answer one offer (`name; param; param=value`), or `None` to decline
    /// it.
    fn accept(offer: &[u8]) -> Option<Self> {
        let mut parts = Unquoted::split(offer, b';');
        if trim_ows(parts.next()?) != NAME {
            return None;
        }
        let mut params = Self {
            server_no_context_takeover: false,
            client_no_context_takeover: false,
            server_max_window_bits: None,
            client_max_window_bits: None,
        };
        let mut seen = [false; 4];
        for part in parts {
            let part = trim_ows(part);
            let (name, value) = match part.iter().position(|&b| b == b'=') {
                Some(eq) => (
                    trim_ows(&part[..eq]),
                    Some(unquote(trim_ows(&part[eq + 1..]))?),
                ),
                None => (part, None),
            };
            let param = Param::from_name(name)?;
            if mem::replace(&mut seen[param as usize], true) {
                return None;
            }
            match (param, value.as_deref()) {
                (Param::ServerNoContextTakeover, None) => params.server_no_context_takeover = true,
                (Param::ClientNoContextTakeover, None) => params.client_no_context_takeover = true,
                (Param::ServerMaxWindowBits, Some(value)) => {
                    let bits = window_bits(value)?;
                    if bits < MIN_SERVER_WINDOW_BITS {
                        return None;
                    }
                    params.server_max_window_bits = Some(bits);
                }
                // Without a value the client only says it could use a smaller window: ours
                // inflates any, so the answer leaves the parameter out.
                (Param::ClientMaxWindowBits, None) => {}
                (Param::ClientMaxWindowBits, Some(value)) => {
                    params.client_max_window_bits = Some(window_bits(value)?);
                }
                (Param::ServerNoContextTakeover | Param::ClientNoContextTakeover, Some(_))
                | (Param::ServerMaxWindowBits, None) => return None,
            }
        }
        Some(params)
    }

    /// The response's `Sec-WebSocket-Extensions` value, e.g. `permessage-deflate` or
    /// `permessage-deflate; server_no_context_takeover; client_max_window_bits=12`.
    ///
    /// `server_max_window_bits` is answered whenever the client offered it, 15 included (RFC 7692
    /// §7.1.2.1: the answer must carry a value no larger than the offered one).
    pub fn response_value(&self) -> String {
        let mut value = String::from("permessage-deflate");
        if self.server_no_context_takeover {
            value.push_str("; server_no_context_takeover");
        }
        if self.client_no_context_takeover {
            value.push_str("; client_no_context_takeover");
        }
        if let Some(bits) = self.server_max_window_bits {
            let _ = write!(value, "; server_max_window_bits={bits}");
        }
        if let Some(bits) = self.client_max_window_bits {
            let _ = write!(value, "; client_max_window_bits={bits}");
        }
        value
    }
}

/// A window size: a decimal integer from 8 to 15 without leading zeros (RFC 7692 §7.1.2).
fn window_bits(value: &[u8]) -> Option<u8> {
    match *value {
        [digit @ b'8'..=b'9'] => Some(digit - b'0'),
        [b'1', digit @ b'0'..=b'5'] => Some(10 + digit - b'0'),
        _ => None,
    }
}

/// A parameter value: a token, or a quoted-string whose unescaped content is a token (RFC 7692
/// §7.1). `None` if it is neither.
fn unquote(value: &[u8]) -> Option<Cow<'_, [u8]>> {
    let value = match value {
        [b'"', inner @ ..] => {
            let mut out = Vec::with_capacity(inner.len());
            let mut bytes = inner.iter();
            loop {
                match *bytes.next()? {
                    b'\\' => out.push(*bytes.next()?),
                    b'"' if bytes.as_slice().is_empty() => break Cow::Owned(out),
                    b'"' => return None,
                    byte => out.push(byte),
                }
            }
        }
        _ => Cow::Borrowed(value),
    };
    let is_tchar = |&b: &u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    (!value.is_empty() && value.iter().all(is_tchar)).then_some(value)
}

/// Splits a header value at `delim` outside quoted-strings (a quoted `,` or `;` is part of a
/// value). An unterminated quoted-string runs to the end, where [`unquote`] refuses it.
struct Unquoted<'a> {
    rest: Option<&'a [u8]>,
    delim: u8,
}

impl<'a> Unquoted<'a> {
    fn split(value: &'a [u8], delim: u8) -> Self {
        Self {
            rest: Some(value),
            delim,
        }
    }
}

impl<'a> Iterator for Unquoted<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let rest = self.rest?;
        let (mut quoted, mut escaped) = (false, false);
        for (i, &b) in rest.iter().enumerate() {
            match b {
                _ if escaped => escaped = false,
                b'\\' if quoted => escaped = true,
                b'"' => quoted = !quoted,
                _ if b == self.delim && !quoted => {
                    self.rest = Some(&rest[i + 1..]);
                    return Some(&rest[..i]);
                }
                _ => {}
            }
        }
        self.rest = None;
        Some(rest)
    }
}

/// The server's compressor for one connection.
///
/// It holds a deflate state for the life of the connection: by zlib's formula `2^(window_bits + 2)`
/// bytes + 128 KiB (256 KiB with the default 15-bit window). The level is zlib's default (6), as
/// in Python's `websockets` and Tornado.
#[derive(Debug)]
pub struct Compressor {
    deflate: Compress,
    /// `server_no_context_takeover`: reset after each message.
    reset_each_message: bool,
}

impl Compressor {
    /// # Panics
    ///
    /// If `params.server_max_window_bits` is outside 9..=15 ([`DeflateParams::negotiate`] never
    /// gives such a value).
    pub fn new(params: &DeflateParams) -> Self {
        let bits = params.server_max_window_bits.unwrap_or(MAX_WINDOW_BITS);
        assert!(
            (MIN_SERVER_WINDOW_BITS..=MAX_WINDOW_BITS).contains(&bits),
            "server_max_window_bits {bits} is outside 9..=15"
        );
        Self {
            deflate: Compress::new_with_window_bits(Compression::default(), false, bits),
            reset_each_message: params.server_no_context_takeover,
        }
    }

    /// Appends the compressed payload of one whole message to `out`: raw deflate, Z_SYNC_FLUSH,
    /// with the trailing 0x00 0x00 0xff 0xff removed (RFC 7692 §7.2.1); the context is reset after
    /// the message when `server_no_context_takeover`.
    pub fn compress(&mut self, data: &[u8], out: &mut Vec<u8>) {
        let start = out.len();
        // Feed the message without flushing, at least once: the call also tells zlib that the
        // previous flush is over, so the sync flush below writes its empty stored block even for
        // an empty message (zlib skips a flush that repeats the last one with no new input).
        let mut at = 0;
        loop {
            out.reserve((data.len() - at) / 2 + 64);
            let before = self.deflate.total_in();
            self.run(&data[at..], out, FlushCompress::None);
            at += (self.deflate.total_in() - before) as usize;
            if at == data.len() {
                break;
            }
        }
        // The flush is complete once it returns with output space left over.
        loop {
            out.reserve(64);
            self.run(&[], out, FlushCompress::Sync);
            if out.len() < out.capacity() {
                break;
            }
        }
        debug_assert!(out[start..].ends_with(&TAIL), "a sync flush ends with TAIL");
        if out[start..].ends_with(&TAIL) {
            out.truncate(out.len() - TAIL.len());
        }
        if self.reset_each_message {
            self.deflate.reset();
        }
    }

    fn run(&mut self, input: &[u8], out: &mut Vec<u8>, flush: FlushCompress) {
        // zlib fails only on a broken stream state or bad arguments, neither of which can come
        // from the message; running out of space is `Ok(BufError)`, handled by the callers.
        self.deflate
            .compress_vec(input, out, flush)
            .expect("deflate of a message failed: zlib state corrupted");
    }
}

/// Why a compressed message was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InflateError {
    /// The inflated message would be longer than the limit.
    TooBig,
    /// Not valid deflate data.
    Corrupt,
}

/// First size of the inflated message's buffer, unless the limit is lower: the buffer then
/// doubles, so a bomb allocates no more than the limit plus one byte.
const MIN_INFLATE_BUFFER: usize = 4096;

/// Inflates the client's compressed messages (the decoder's side of the extension).
#[derive(Debug)]
pub(crate) struct Inflater {
    inflate: Decompress,
    /// `client_no_context_takeover`: reset after each message.
    reset_each_message: bool,
}

impl Inflater {
    /// An inflater that forgets the context after each message if `client_no_context_takeover`.
    pub(crate) fn new(client_no_context_takeover: bool) -> Self {
        Self {
            inflate: Decompress::new_with_window_bits(false, MAX_WINDOW_BITS),
            reset_each_message: client_no_context_takeover,
        }
    }

    /// Inflates one whole message's compressed payload (TAIL not included) into `out`, which
    /// must be empty. Fails with `TooBig` as soon as the output passes `max` bytes: `out`'s
    /// capacity never passes `max + 1`. After an error the inflater is unusable (the connection
    /// fails).
    pub(crate) fn inflate(
        &mut self,
        payload: &[u8],
        max: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), InflateError> {
        if payload.is_empty() {
            return Ok(());
        }
        // A final block inside the payload ends the stream there: TAIL then belongs to nothing.
        if self.inflate_part(payload, max, out)? {
            self.inflate_part(&TAIL, max, out)?;
        }
        if self.reset_each_message {
            self.inflate.reset(false);
        }
        Ok(())
    }

    /// Inflates `input` (the payload, then TAIL) into `out`. Returns whether the stream goes on
    /// (`false` after a final block, which resets the inflater for the next message).
    fn inflate_part(
        &mut self,
        input: &[u8],
        max: usize,
        out: &mut Vec<u8>,
    ) -> Result<bool, InflateError> {
        let limit = max.saturating_add(1);
        let mut at = 0;
        loop {
            if out.len() == out.capacity() {
                let grown = (out.capacity().saturating_mul(2))
                    .max(MIN_INFLATE_BUFFER)
                    .min(limit);
                // `out.len() <= max < limit` here, so the buffer grows by at least one byte.
                out.try_reserve_exact(grown - out.len())
                    .map_err(|_| InflateError::TooBig)?;
            }
            let (in_before, out_before) = (self.inflate.total_in(), out.len());
            let status = self
                .inflate
                .decompress_vec(&input[at..], out, FlushDecompress::Sync)
                .map_err(|_| InflateError::Corrupt)?;
            at += (self.inflate.total_in() - in_before) as usize;
            if out.len() > max {
                return Err(InflateError::TooBig);
            }
            if status == Status::StreamEnd {
                // What follows a final block is ignored, as zlib does: a sender that ends a
                // message with one still appends the empty stored block of §7.2.1, whose first
                // byte stays in the payload.
                self.inflate.reset(false);
                return Ok(false);
            }
            let progressed = self.inflate.total_in() != in_before || out.len() > out_before;
            // All input taken and output space left over: zlib has written all it can.
            if at == input.len() && (out.len() < out.capacity() || !progressed) {
                return Ok(true);
            }
            if !progressed {
                // Input left and room to write, yet nothing moved: never loop on it.
                return Err(InflateError::Corrupt);
            }
        }
    }
}

#[cfg(test)]
pub(super) mod tests;
