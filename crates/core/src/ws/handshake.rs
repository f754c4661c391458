//! The opening handshake (RFC 6455 §4.2): checks on the upgrade request's fields and the
//! `Sec-WebSocket-Accept` value of the 101 response.
//!
//! The connection layer decides that a request asks for a WebSocket (`GET`, HTTP/1.1,
//! `Upgrade: websocket` and `Connection: upgrade`, checked with [`has_token`]), then checks the
//! version and the key here. Field values arrive as the HTTP parser left them: surrounding
//! whitespace stripped, bytes not necessarily ASCII.

use std::fmt;

use super::sha1::sha1;

/// Appended to the client's key before hashing (RFC 6455 §1.3).
const ACCEPT_GUID: &[u8] = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

const BASE64_ALPHABET: &[u8; 64] =
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

const MISSING_VERSION: HandshakeError = HandshakeError::new(
    426,
    "WebSocket upgrade without Sec-WebSocket-Version; this server speaks version 13",
);
const UNSUPPORTED_VERSION: HandshakeError = HandshakeError::new(
    426,
    "unsupported Sec-WebSocket-Version; this server speaks version 13",
);
const BAD_KEY: HandshakeError = HandshakeError::new(
    400,
    "Sec-WebSocket-Key is not the base64 encoding of 16 bytes (24 characters ending in ==)",
);

/// An upgrade request the server refuses: answer `status` with `reason` as the body, and for
/// 426 add `Sec-WebSocket-Version: 13` (RFC 6455 §4.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandshakeError {
    /// 400 for a malformed key, 426 for a missing or unsupported version.
    pub status: u16,
    /// Names the field at fault and what it must be.
    pub reason: &'static str,
}

impl HandshakeError {
    const fn new(status: u16, reason: &'static str) -> Self {
        Self { status, reason }
    }
}

impl fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.status, self.reason)
    }
}

impl std::error::Error for HandshakeError {}

/// The `Sec-WebSocket-Accept` value for the client's `Sec-WebSocket-Key`:
/// base64(SHA-1(key ++ "258EAFA5-E914-47DA-95CA-C5AB0DC85B11")) (RFC 6455 §4.2.2).
pub fn accept_key(key: &[u8]) -> [u8; 28] {
    let digest = sha1(&[key, ACCEPT_GUID]);
    let mut out = [b'='; 28];
    // 20 bytes: six whole 3-byte groups, then 2 bytes that make 3 characters and one `=`.
    for (group, chars) in digest.chunks(3).zip(out.chunks_mut(4)) {
        let bits = group.iter().enumerate().fold(0u32, |bits, (i, &byte)| {
            bits | u32::from(byte) << (16 - 8 * i)
        });
        for (i, c) in chars.iter_mut().take(group.len() + 1).enumerate() {
            *c = BASE64_ALPHABET[(bits >> (18 - 6 * i)) as usize & 0x3f];
        }
    }
    out
}

/// Checks that `Sec-WebSocket-Key` is the base64 encoding (standard alphabet, padded) of 16
/// bytes, as RFC 6455 §4.1 requires: 22 alphabet characters then `==`.
///
/// The 4 unused bits of the last character are not checked: the key is an opaque nonce, and
/// Python's `websockets` (uvicorn's default) does not check them either.
pub fn check_key(value: &[u8]) -> Result<(), HandshakeError> {
    match value {
        [chars @ .., b'=', b'=']
            if chars.len() == 22 && chars.iter().all(|c| BASE64_ALPHABET.contains(c)) =>
        {
            Ok(())
        }
        _ => Err(BAD_KEY),
    }
}

/// Checks `Sec-WebSocket-Version` (`None` when the request has none): it must be exactly `13`.
pub fn check_version(value: Option<&[u8]>) -> Result<(), HandshakeError> {
    match value {
        Some(b"13") => Ok(()),
        Some(_) => Err(UNSUPPORTED_VERSION),
        None => Err(MISSING_VERSION),
    }
}

/// Whether the comma-separated field value `list` has an element equal to `token`, ASCII
/// case-insensitively, ignoring optional whitespace (spaces and tabs) around elements and empty
/// elements (RFC 9110 §5.6.1). For `Connection: keep-alive, Upgrade` and `Upgrade: websocket`.
pub fn has_token(list: &[u8], token: &[u8]) -> bool {
    list.split(|&b| b == b',')
        .any(|element| trim_ows(element).eq_ignore_ascii_case(token))
}

/// `bytes` without spaces and tabs (HTTP's optional whitespace) at either end.
fn trim_ows(bytes: &[u8]) -> &[u8] {
    let is_text = |b: &u8| *b != b' ' && *b != b'\t';
    let start = bytes.iter().position(is_text).unwrap_or(bytes.len());
    let end = bytes.iter().rposition(is_text).map_or(start, |i| i + 1);
    &bytes[start..end]
}

#[cfg(test)]
mod tests;
