//! The WebSocket codec (RFC 6455), server side, sans-IO: bytes from the client in, whole messages
//! and control frames out, frame headers to send back.
//!
//! Nothing here touches a socket or Python. After the HTTP/1.1 upgrade, the connection layer owns
//! the read buffer and the socket and drives these pieces:
//!
//! * [`handshake`] checks the upgrade request ([`check_version`], [`check_key`], [`has_token`] for
//!   `Connection: upgrade` and `Upgrade: websocket`) and computes the `Sec-WebSocket-Accept` value
//!   ([`accept_key`]); a refusal is a [`HandshakeError`] with the status to answer (400 or 426).
//! * [`Decoder`] turns the client's byte stream into [`Event`]s: whole data messages
//!   (defragmented, unmasked, inflated if compressed, text checked as UTF-8), pings, pongs and the
//!   close frame. A violation is a [`ProtocolError`] carrying the close code to send (1002, 1007
//!   or 1009).
//! * [`deflate`] is the permessage-deflate extension (RFC 7692): [`DeflateParams::negotiate`]
//!   picks the client's first acceptable offer and [`DeflateParams::response_value`] answers it;
//!   [`Decoder::with_deflate`] then inflates compressed messages, and the server compresses its
//!   own with a [`Compressor`] (the frame's RSV1 bit is the caller's to set).
//! * [`encode_head`] writes the header of an unmasked server frame, so header and payload go out
//!   as two buffers without copying the payload; [`close_payload`] builds a close frame's payload.
//!
//! Invariants of the decoder:
//! * What it owns: the payload of the data message in progress (all its fragments so far,
//!   unmasked) and of the control frame in progress (at most 125 bytes). It never holds more than
//!   `max_message` bytes of message: a frame whose declared length would take the message past the
//!   limit is refused with 1009 as soon as its header shows that length, before any of its payload
//!   is read. It holds no frame header: a header is parsed only once it is complete. With
//!   permessage-deflate it also owns the client's LZ77 context (kept across messages unless
//!   `client_no_context_takeover`); a compressed message (RSV1 on its first frame, and only there)
//!   is collected compressed under the same limit, and inflated when its last frame is complete.
//! * When it consumes: each [`Decoder::decode`] call consumes a prefix of the caller's input and
//!   returns at most one event. A frame header (2 to 14 bytes) is consumed only when complete, so
//!   the caller keeps an incomplete header and offers it again with more bytes appended; payload
//!   bytes are consumed as they arrive (copied into the decoder's buffer), so a large message
//!   streams through without the caller buffering it. A call that returns an event stops exactly
//!   at the end of the frame that completed it; a call returns `(0, None)` only when it needs more
//!   input (or after the close frame). The events and the error are the same for any split of the
//!   input (the unit tests feed every case whole, byte by byte, and followed by another frame).
//! * It never panics, whatever the input, and its memory is bounded by the limit: the message
//!   buffer's capacity is at most twice `max_message` (`Vec` growth over fragments), the control
//!   buffer's 125 bytes. Inflating adds a buffer whose capacity is at most `max_message + 1`:
//!   inflation stops with 1009 as soon as the output passes the limit, so a decompression bomb
//!   costs no more than an honest message (plus the inflater's 32 KiB window and about 7 KiB of
//!   state, per connection). Every check is a function of the bytes seen so far, made in stream
//!   order, so any split of the input finds the same first error; a compressed message's inflated
//!   bytes (deflate errors, size, UTF-8) are checked when its last frame is complete, whatever the
//!   split.
//! * An error is final: the caller sends a close frame with [`ProtocolError::code`] and closes.
//!   Calling `decode` again returns the same error and consumes nothing. After the close frame's
//!   [`Event::Close`] the decoder consumes nothing more (RFC 6455 §5.5.1: no data frame may
//!   follow), returning `(0, None)`.

pub mod deflate;
pub mod frame;
pub mod handshake;
mod sha1;

#[cfg(test)]
mod random_tests;

pub use deflate::{Compressor, DeflateParams};
pub use frame::{
    close_payload, encode_head, Decoder, Event, Opcode, ProtocolError, MAX_HEAD_LEN, RSV1,
};
pub use handshake::{accept_key, check_key, check_version, has_token, HandshakeError};
