//! WebSocket frames (RFC 6455 §5): the [`Decoder`] of the client's byte stream and the encoder of
//! server frame headers.
//!
//! A frame is a header and a payload:
//!
//! ```text
//!  byte 0: FIN | RSV1 RSV2 RSV3 | opcode (4 bits)
//!  byte 1: MASK | payload length (7 bits: 0-125, or 126 = 16-bit length follows, 127 = 64-bit)
//!  [2 or 8 bytes of extended length, big-endian]
//!  [4 bytes of masking key: present iff MASK is set; a client always masks]
//!  payload (masked: byte i is XORed with key[i % 4])
//! ```
//!
//! The decoder's state is plain data (print it with `{:?}`): `State` says where in the stream it
//! is, and the message in progress holds the fragments seen so far. The module invariants (what
//! it owns, when it consumes, that an error is final) are in [`crate::ws`].
//!
//! Decisions beyond the RFC's MUSTs:
//! * A length encoded in more bytes than needed (126 followed by a value below 126, say) is
//!   accepted, as Python's `websockets` (uvicorn's default) and most servers do.
//! * A compressed message (permessage-deflate, RFC 7692) is limited twice by `max_message`: its
//!   compressed bytes as they arrive, like any message, and its inflated size, checked while
//!   inflating (see [`crate::ws::deflate`]).
//! * Close codes 1012-1014 (Service Restart, Try Again Later, Bad Gateway), registered with IANA
//!   after RFC 6455, are accepted: this server itself closes with 1012 on shutdown, and
//!   `websockets` accepts them too. 1004-1006, 1015 and the rest below 3000 are refused.

use std::fmt;
use std::mem;

use super::deflate::{DeflateParams, InflateError, Inflater};

/// Longest server frame header: 2 bytes, then a 64-bit length (no masking key: servers do not
/// mask).
pub const MAX_HEAD_LEN: usize = 10;

/// Longest control frame payload (RFC 6455 §5.5).
const MAX_CONTROL_PAYLOAD: u8 = 125;
/// Longest close reason: the control payload less the 2-byte code (RFC 6455 §5.5.1).
const MAX_CLOSE_REASON: usize = MAX_CONTROL_PAYLOAD as usize - 2;

/// Byte 0's RSV1 bit: a compressed message's first frame when permessage-deflate is on (the
/// server sets it on the header [`encode_head`] wrote for a compressed message).
pub const RSV1: u8 = 0x40;
/// Byte 0's RSV2 and RSV3 bits, which no supported extension uses.
const RSV2_RSV3: u8 = 0x30;

const RESERVED_BITS: ProtocolError = ProtocolError::new(
    1002,
    "RSV bit set in a frame, but no extension was negotiated",
);
const RSV2_RSV3_SET: ProtocolError = ProtocolError::new(
    1002,
    "RSV2 or RSV3 set in a frame, but no extension using them was negotiated",
);
const RSV1_NOT_FIRST: ProtocolError = ProtocolError::new(
    1002,
    "RSV1 set on a continuation or control frame: only a message's first frame marks compression",
);
const RESERVED_OPCODE: ProtocolError = ProtocolError::new(1002, "frame with a reserved opcode");
const FRAGMENTED_CONTROL: ProtocolError = ProtocolError::new(
    1002,
    "control frame without FIN: control frames cannot be fragmented",
);
const CONTINUATION_WITHOUT_MESSAGE: ProtocolError = ProtocolError::new(
    1002,
    "continuation frame without a fragmented message to continue",
);
const MESSAGE_INTERRUPTED: ProtocolError = ProtocolError::new(
    1002,
    "new data frame before the fragmented message was finished",
);
const UNMASKED: ProtocolError = ProtocolError::new(1002, "client frame not masked");
const CONTROL_TOO_LONG: ProtocolError =
    ProtocolError::new(1002, "control frame payload longer than 125 bytes");
const LENGTH_HIGH_BIT: ProtocolError = ProtocolError::new(
    1002,
    "64-bit payload length with the most significant bit set",
);
const MESSAGE_TOO_BIG: ProtocolError = ProtocolError::new(
    1009,
    "message larger than the server accepts (--ws-max-size)",
);
const BAD_TEXT: ProtocolError = ProtocolError::new(1007, "text message is not valid UTF-8");
// 1002, as the websockets library (uvicorn's) closes on data that does not inflate; RFC 7692
// §8 asks to fail the connection without naming a code.
const BAD_DEFLATE: ProtocolError = ProtocolError::new(
    1002,
    "compressed message could not be inflated: not valid deflate data",
);
const CLOSE_ONE_BYTE: ProtocolError =
    ProtocolError::new(1002, "close frame payload of 1 byte: a close code takes 2");
const BAD_CLOSE_CODE: ProtocolError = ProtocolError::new(
    1002,
    "close code not allowed in a close frame (RFC 6455 section 7.4)",
);
const BAD_CLOSE_REASON: ProtocolError =
    ProtocolError::new(1007, "close frame reason is not valid UTF-8");

/// A frame's opcode (RFC 6455 §5.2). The other values (3-7, 11-15) are reserved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opcode {
    Continuation = 0,
    Text = 1,
    Binary = 2,
    Close = 8,
    Ping = 9,
    Pong = 10,
}

impl Opcode {
    /// The opcode with these 4 bits, or `None` for a reserved one.
    pub fn from_bits(bits: u8) -> Option<Self> {
        match bits {
            0 => Some(Self::Continuation),
            1 => Some(Self::Text),
            2 => Some(Self::Binary),
            8 => Some(Self::Close),
            9 => Some(Self::Ping),
            10 => Some(Self::Pong),
            _ => None,
        }
    }

    /// Close, Ping and Pong: at most 125 bytes, never fragmented, allowed between fragments.
    pub fn is_control(self) -> bool {
        self as u8 >= 8
    }
}

/// A violation of RFC 6455 by the client: send a close frame with `code` (1002 protocol error,
/// 1007 invalid UTF-8, 1009 message too big) and `reason`, then close.
///
/// `reason` names the cause and is at most 123 bytes, so it fits in the close frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProtocolError {
    pub code: u16,
    pub reason: &'static str,
}

impl ProtocolError {
    const fn new(code: u16, reason: &'static str) -> Self {
        assert!(reason.len() <= MAX_CLOSE_REASON);
        Self { code, reason }
    }
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.code, self.reason)
    }
}

impl std::error::Error for ProtocolError {}

/// What the client sent: one whole message or one control frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A whole text message, its fragments joined and unmasked. The bytes are valid UTF-8 (the
    /// decoder checked them), so `String::from_utf8_unchecked` on them is sound and a caller
    /// making a Python `str` need not check them again.
    Text(Vec<u8>),
    /// A whole binary message, its fragments joined and unmasked.
    Binary(Vec<u8>),
    /// A ping: the caller answers with a pong carrying the same payload (RFC 6455 §5.5.2).
    Ping(Vec<u8>),
    /// A pong (solicited or not).
    Pong(Vec<u8>),
    /// The close frame: `code` is `None` when the payload was empty (report 1005 to the
    /// application, RFC 6455 §7.1.5); the code is valid per §7.4 and `reason` may be empty. The
    /// decoder consumes nothing after it.
    Close { code: Option<u16>, reason: String },
}

/// Where in the client's stream the decoder is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// At a frame boundary: the next bytes are a frame header.
    Head,
    /// In a frame's payload, `remaining` bytes still to come; `mask` is the masking key rotated
    /// so that `mask[0]` applies to the next payload byte.
    Payload {
        opcode: Opcode,
        fin: bool,
        remaining: u64,
        mask: [u8; 4],
    },
    /// The close frame was decoded; nothing more is consumed.
    Closed,
    /// This error was returned; it is returned again.
    Failed(ProtocolError),
}

/// The data message being received, across its fragments.
#[derive(Debug, Default)]
struct Message {
    /// `Text` or `Binary` from the message's first frame header on, `None` between messages.
    kind: Option<Opcode>,
    /// RSV1 was set on the first frame: `data` is deflate data, inflated when the message ends.
    compressed: bool,
    /// The payload so far, unmasked; at most the decoder's `max_message` bytes.
    data: Vec<u8>,
    /// For uncompressed text, `data[..checked]` is valid UTF-8 and the rest (at most 3 bytes) a
    /// prefix of a character that may be completed by the next bytes.
    checked: usize,
}

impl Message {
    /// Checks the text bytes added since the last call, so invalid UTF-8 fails fast (even in
    /// the middle of a frame) and every byte is checked about once.
    fn check_text(&mut self) -> Result<(), ProtocolError> {
        match std::str::from_utf8(&self.data[self.checked..]) {
            Ok(_) => self.checked = self.data.len(),
            // The tail is an incomplete character that later bytes may finish.
            Err(e) if e.error_len().is_none() => self.checked += e.valid_up_to(),
            Err(_) => return Err(BAD_TEXT),
        }
        Ok(())
    }
}

/// Decodes the client side of one WebSocket connection. See the invariants in [`crate::ws`].
#[derive(Debug)]
pub struct Decoder {
    /// Largest message accepted, in bytes (the sum of its fragments).
    max_message: usize,
    state: State,
    message: Message,
    /// The payload of the control frame in progress, unmasked (at most 125 bytes).
    control: Vec<u8>,
    /// The client's deflate context when permessage-deflate was negotiated: RSV1 is then allowed
    /// on a message's first frame.
    inflater: Option<Inflater>,
}

impl Decoder {
    /// A decoder for a new connection that refuses messages over `max_message` bytes with 1009.
    pub fn new(max_message: usize) -> Self {
        Self {
            max_message,
            state: State::Head,
            message: Message::default(),
            control: Vec::new(),
            inflater: None,
        }
    }

    /// A decoder that accepts compressed messages (RSV1 on a message's first frame) as
    /// negotiated by `params`. `Decoder::new(max)` stays as it is (no extension: RSV1 refused as
    /// today).
    pub fn with_deflate(max_message: usize, params: &DeflateParams) -> Self {
        Self {
            inflater: Some(Inflater::new(params.client_no_context_takeover)),
            ..Self::new(max_message)
        }
    }

    /// Consumes a prefix of `input` and returns how many bytes it consumed, with at most one
    /// event.
    ///
    /// The caller keeps the unconsumed bytes, appends the next read to them, and calls again;
    /// calling until the answer is `(0, None)` drains everything decodable. `(0, None)` means
    /// more input is needed (or the close frame was decoded). An event ends the call exactly at
    /// the end of its last frame. An `Err` is final (see the module invariants).
    pub fn decode(&mut self, input: &[u8]) -> Result<(usize, Option<Event>), ProtocolError> {
        match self.state {
            State::Failed(err) => return Err(err),
            State::Closed => return Ok((0, None)),
            State::Head | State::Payload { .. } => {}
        }
        self.step(input).inspect_err(|&err| {
            self.state = State::Failed(err);
            self.message = Message::default();
            self.control = Vec::new();
        })
    }

    /// `decode` in the `Head` and `Payload` states: frames until an event or the input's end.
    fn step(&mut self, input: &[u8]) -> Result<(usize, Option<Event>), ProtocolError> {
        let mut at = 0;
        loop {
            if let State::Payload {
                opcode,
                fin,
                remaining,
                mut mask,
            } = self.state
            {
                let available = input.len() - at;
                let n = usize::try_from(remaining).map_or(available, |r| r.min(available));
                if n == 0 && remaining > 0 {
                    return Ok((at, None));
                }
                self.take_payload(opcode, remaining, mask, &input[at..at + n])?;
                at += n;
                let remaining = remaining - n as u64;
                if remaining > 0 {
                    mask.rotate_left(n % 4);
                    self.state = State::Payload {
                        opcode,
                        fin,
                        remaining,
                        mask,
                    };
                    return Ok((at, None));
                }
                self.state = State::Head;
                if let Some(event) = self.end_frame(opcode, fin)? {
                    return Ok((at, Some(event)));
                }
            }
            let Some((head_len, payload)) = self.parse_head(&input[at..])? else {
                return Ok((at, None));
            };
            at += head_len;
            self.state = payload;
        }
    }

    /// Parses the frame header at the start of `buf`: its length and the `Payload` state that
    /// follows, or `None` if the header is incomplete. Checks each field as soon as its bytes
    /// are there, in stream order, so any split of the input finds the same first error.
    fn parse_head(&mut self, buf: &[u8]) -> Result<Option<(usize, State)>, ProtocolError> {
        let [b0, b1, ..] = *buf else {
            return Ok(None);
        };
        let fin = b0 & 0x80 != 0;
        let deflate = self.inflater.is_some();
        if b0 & (RSV1 | RSV2_RSV3) != 0 && !deflate {
            return Err(RESERVED_BITS);
        }
        if b0 & RSV2_RSV3 != 0 {
            return Err(RSV2_RSV3_SET);
        }
        let opcode = Opcode::from_bits(b0 & 0x0f).ok_or(RESERVED_OPCODE)?;
        let compressed = b0 & RSV1 != 0;
        if compressed && !matches!(opcode, Opcode::Text | Opcode::Binary) {
            return Err(RSV1_NOT_FIRST);
        }
        let in_message = self.message.kind.is_some();
        match opcode {
            _ if opcode.is_control() && !fin => return Err(FRAGMENTED_CONTROL),
            Opcode::Continuation if !in_message => return Err(CONTINUATION_WITHOUT_MESSAGE),
            Opcode::Text | Opcode::Binary if in_message => return Err(MESSAGE_INTERRUPTED),
            _ => {}
        }
        if b1 & 0x80 == 0 {
            return Err(UNMASKED);
        }
        let len7 = b1 & 0x7f;
        if opcode.is_control() && len7 > MAX_CONTROL_PAYLOAD {
            return Err(CONTROL_TOO_LONG);
        }
        let extended = match len7 {
            126 => 2,
            127 => 8,
            _ => 0,
        };
        let Some(length_bytes) = buf.get(2..2 + extended) else {
            return Ok(None);
        };
        let seed = if extended == 0 { u64::from(len7) } else { 0 };
        let len = length_bytes
            .iter()
            .fold(seed, |len, &byte| (len << 8) | u64::from(byte));
        if len >> 63 != 0 {
            return Err(LENGTH_HIGH_BIT);
        }
        if !opcode.is_control() {
            let room = self.max_message.saturating_sub(self.message.data.len());
            if len > room as u64 {
                return Err(MESSAGE_TOO_BIG);
            }
        }
        let head_len = 2 + extended + 4;
        let Some(&[m0, m1, m2, m3]) = buf.get(2 + extended..head_len) else {
            return Ok(None);
        };
        if matches!(opcode, Opcode::Text | Opcode::Binary) {
            self.message.kind = Some(opcode);
            self.message.compressed = compressed;
        }
        let payload = State::Payload {
            opcode,
            fin,
            remaining: len,
            mask: [m0, m1, m2, m3],
        };
        Ok(Some((head_len, payload)))
    }

    /// Copies `chunk` (the next payload bytes of a frame with `remaining` bytes left) into the
    /// frame's buffer, unmasked; checks text as it arrives.
    fn take_payload(
        &mut self,
        opcode: Opcode,
        remaining: u64,
        mask: [u8; 4],
        chunk: &[u8],
    ) -> Result<(), ProtocolError> {
        if chunk.is_empty() {
            return Ok(());
        }
        let buf = if opcode.is_control() {
            &mut self.control
        } else {
            &mut self.message.data
        };
        // The header checked the length against the limit: reserve the whole frame once, so a
        // large frame is copied in without regrowing. If that much is not available up front (a
        // limit near usize::MAX), the buffer grows as bytes arrive instead of failing here.
        let _ = buf.try_reserve(usize::try_from(remaining).unwrap_or(usize::MAX));
        let start = buf.len();
        buf.extend_from_slice(chunk);
        unmask(&mut buf[start..], mask);
        // Compressed text is checked once inflated.
        if !opcode.is_control()
            && self.message.kind == Some(Opcode::Text)
            && !self.message.compressed
        {
            self.message.check_text()?;
        }
        Ok(())
    }

    /// The event that the frame just completed yields, if any.
    fn end_frame(&mut self, opcode: Opcode, fin: bool) -> Result<Option<Event>, ProtocolError> {
        let event = match opcode {
            Opcode::Ping => Event::Ping(mem::take(&mut self.control)),
            Opcode::Pong => Event::Pong(mem::take(&mut self.control)),
            Opcode::Close => {
                let event = close_event(&self.control)?;
                self.state = State::Closed;
                self.message = Message::default();
                self.control = Vec::new();
                event
            }
            Opcode::Continuation | Opcode::Text | Opcode::Binary if fin => {
                let message = mem::take(&mut self.message);
                let text = message.kind == Some(Opcode::Text);
                let data = match (message.compressed, &mut self.inflater) {
                    (true, Some(inflater)) => {
                        let mut data = Vec::new();
                        inflater
                            .inflate(&message.data, self.max_message, &mut data)
                            .map_err(|err| match err {
                                InflateError::TooBig => MESSAGE_TOO_BIG,
                                InflateError::Corrupt => BAD_DEFLATE,
                            })?;
                        if text && std::str::from_utf8(&data).is_err() {
                            return Err(BAD_TEXT);
                        }
                        data
                    }
                    // The message ends inside a character.
                    _ if text && message.checked != message.data.len() => return Err(BAD_TEXT),
                    _ => message.data,
                };
                if text {
                    Event::Text(data)
                } else {
                    Event::Binary(data)
                }
            }
            Opcode::Continuation | Opcode::Text | Opcode::Binary => return Ok(None),
        };
        Ok(Some(event))
    }
}

/// The event for a close frame's `payload`: empty, or a valid code and a UTF-8 reason.
fn close_event(payload: &[u8]) -> Result<Event, ProtocolError> {
    match *payload {
        [] => Ok(Event::Close {
            code: None,
            reason: String::new(),
        }),
        [_] => Err(CLOSE_ONE_BYTE),
        [hi, lo, ref reason @ ..] => {
            let code = u16::from_be_bytes([hi, lo]);
            if !matches!(code, 1000..=1003 | 1007..=1014 | 3000..=4999) {
                return Err(BAD_CLOSE_CODE);
            }
            let reason = std::str::from_utf8(reason).map_err(|_| BAD_CLOSE_REASON)?;
            Ok(Event::Close {
                code: Some(code),
                reason: reason.to_owned(),
            })
        }
    }
}

/// XORs `data` with the masking key, `mask[0]` applying to `data[0]`. Eight bytes at a time
/// (the key repeated twice as one word), which the compiler may widen further: messages can be
/// megabytes.
fn unmask(data: &mut [u8], mask: [u8; 4]) {
    let [a, b, c, d] = mask;
    let wide = u64::from_ne_bytes([a, b, c, d, a, b, c, d]);
    let mut words = data.chunks_exact_mut(8);
    for word in &mut words {
        let mut bytes = [0; 8];
        bytes.copy_from_slice(word);
        word.copy_from_slice(&(u64::from_ne_bytes(bytes) ^ wide).to_ne_bytes());
    }
    // Whole words keep the key's phase (8 is a multiple of 4): the tail starts at mask[0].
    for (byte, m) in words.into_remainder().iter_mut().zip(mask.iter().cycle()) {
        *byte ^= m;
    }
}

/// Writes the header of an unmasked server frame with `payload_len` payload bytes into `out`
/// and returns its length (2, 4 or 10). The payload follows it unchanged on the wire.
pub fn encode_head(
    opcode: Opcode,
    fin: bool,
    payload_len: usize,
    out: &mut [u8; MAX_HEAD_LEN],
) -> usize {
    out[0] = (u8::from(fin) << 7) | opcode as u8;
    if let Ok(len @ 0..=125) = u8::try_from(payload_len) {
        out[1] = len;
        2
    } else if let Ok(len) = u16::try_from(payload_len) {
        out[1] = 126;
        out[2..4].copy_from_slice(&len.to_be_bytes());
        4
    } else {
        out[1] = 127;
        out[2..10].copy_from_slice(&(payload_len as u64).to_be_bytes());
        10
    }
}

/// A close frame's payload: `code` big-endian, then `reason` cut to 123 bytes (the control frame
/// limit) at a UTF-8 character boundary.
pub fn close_payload(code: u16, reason: &[u8]) -> Vec<u8> {
    let mut end = reason.len().min(MAX_CLOSE_REASON);
    // Back up over continuation bytes (0b10xx_xxxx) so the cut does not split a character.
    while end > 0 && end < reason.len() && reason[end] & 0xc0 == 0x80 {
        end -= 1;
    }
    let mut payload = Vec::with_capacity(2 + end);
    payload.extend_from_slice(&code.to_be_bytes());
    payload.extend_from_slice(&reason[..end]);
    payload
}

#[cfg(test)]
mod consume_tests;
#[cfg(test)]
mod deflate_tests;
#[cfg(test)]
mod encode_tests;
#[cfg(test)]
mod tests;
