//! Request bodies: strips Content-Length or chunked framing, one contiguous run at a time.
//!
//! Invariants:
//! * The decoder owns no buffer. Each [`BodyDecoder::decode`] call looks at the caller's input,
//!   consumes a prefix of it (framing bytes and at most one run of body bytes) and reports how much
//!   it consumed. Everything the decoder needs to resume is in its [`State`], which is plain data
//!   (print it with `{:?}`); any split of the input gives the same body and the same errors.
//! * It never consumes a byte past the end of the body: once [`Decoded::done`] is true the rest of
//!   the input (a pipelined request) is untouched, and further calls consume nothing.
//! * After an `Err` the connection is closed; the decoder is not meant to be called again.
//!
//! Chunked framing accepted (RFC 9112 §7.1): `chunk-size [BWS] [; ext] CRLF data CRLF`, repeated,
//! then `0 [ext] CRLF`, trailer fields (read and discarded) and an empty line. Bare LF is refused
//! everywhere in the framing, because a proxy in front might read the lines differently.
//!
//! The trailer section is a header section (RFC 9112 §7.1.2) and gets the head's rules and limits,
//! so that nothing a front proxy could read differently passes as a trailer: each line is
//! `token ":" value CRLF` with no whitespace before the colon and no line folded onto the one
//! before (obs-fold), the value made of HTAB, SP, visible ASCII and obs-text (no NUL or other
//! control byte), exactly as `httparse` checks the head's fields (a test compares the two); the
//! section, final empty line included, is at most [`Limits::max_head_bytes`] bytes and holds at
//! most [`Limits::max_headers`] fields, 431 beyond either, as for the head.

use std::ops::Range;

use super::request::Limits;
use super::response::is_tchar;
use super::{BodyKind, HttpError};

/// Longest chunk-size line (size, whitespace and extensions, without CRLF): ample for any real
/// extension (clients send none), and bounds the bytes read without body progress. hyper bounds
/// extensions too (16 KiB over a whole body).
const MAX_SIZE_LINE: usize = 1024;

const BAD_CHUNK_SIZE: HttpError = HttpError::new(400, "bad chunk size");
const SIZE_LINE_TOO_LONG: HttpError = HttpError::new(
    400,
    "chunk size line longer than 1024 bytes (chunk extensions too long)",
);
const BAD_CHUNK_EXTENSION: HttpError = HttpError::new(400, "invalid byte in a chunk extension");
const BAD_SIZE_LINE_END: HttpError = HttpError::new(400, "chunk size line not ended by CRLF");
const BAD_DATA_END: HttpError = HttpError::new(400, "chunk data not followed by CRLF");
const BAD_TRAILER_LINE_END: HttpError =
    HttpError::new(400, "line in the chunked trailer section not ended by CRLF");
const BAD_TRAILER_NAME: HttpError = HttpError::new(
    400,
    "invalid chunked trailer line (a name that is not a token, no colon, or whitespace before \
     the colon)",
);
const FOLDED_TRAILER: HttpError = HttpError::new(
    400,
    "chunked trailer line starting with whitespace (a folded line, which RFC 9112 §5.2 \
     forbids in requests)",
);
const BAD_TRAILER_VALUE: HttpError =
    HttpError::new(400, "invalid byte in a chunked trailer field value");
const TRAILERS_TOO_LARGE: HttpError = HttpError::new(
    431,
    "chunked trailer section larger than max_head_bytes (default 65536); raise \
     --limit-header-size",
);
const TOO_MANY_TRAILERS: HttpError = HttpError::new(
    431,
    "more chunked trailer fields than max_headers (default 100); raise --limit-headers",
);

/// Where in the chunk-size line the decoder is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SizePhase {
    /// Hex digits of the size.
    Digits,
    /// Spaces or tabs after the size (BWS).
    Space,
    /// After `;`: extensions, ignored up to the CR.
    Extension,
    /// After the CR: the LF must follow.
    Lf,
}

/// Where in a trailer line the decoder is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TrailerPhase {
    /// At the start of a line: a field name, or the CR of the empty line that ends the section.
    LineStart,
    /// In a field name (token characters) until the colon.
    Name,
    /// After the colon: the field value until CR.
    Value,
    /// After a field line's CR: the LF must follow.
    LineLf,
    /// After the final empty line's CR: the LF ends the body.
    EndLf,
}

const TRAILERS_START: State = State::Trailers {
    total: 0,
    fields: 0,
    phase: TrailerPhase::LineStart,
};

/// The decoder's state: everything needed to resume at any byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Content-Length body with this many bytes still to come (never 0: that is `Done`).
    Length { remaining: u64 },
    /// In a chunk-size line: the size so far, whether it has a digit, the line length so far.
    Size {
        size: u64,
        has_digit: bool,
        phase: SizePhase,
        line_len: usize,
    },
    /// In a chunk's data, this many bytes still to come (never 0).
    Data { remaining: u64 },
    /// After a chunk's data: CR, then LF.
    DataEnd { seen_cr: bool },
    /// After the last chunk: trailer lines until an empty one. `total`: bytes of the section
    /// so far; `fields`: complete field lines so far.
    Trailers {
        total: usize,
        fields: usize,
        phase: TrailerPhase,
    },
    /// The body is complete.
    Done,
}

const SIZE_LINE_START: State = State::Size {
    size: 0,
    has_digit: false,
    phase: SizePhase::Digits,
    line_len: 0,
};

/// Strips the framing of one request body. See the module invariants.
#[derive(Debug, Clone)]
pub struct BodyDecoder {
    state: State,
    /// The head's limits, applied to the trailer section too (`max_uri_bytes` is not used).
    limits: Limits,
}

/// What one [`BodyDecoder::decode`] call did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded {
    /// Bytes of the input consumed (framing and body); the next call starts after them.
    pub consumed: usize,
    /// The body bytes, as a subrange of `input[..consumed]`; may be empty.
    pub data: Range<usize>,
    /// The body is complete; nothing more will be consumed.
    pub done: bool,
}

impl BodyDecoder {
    /// A decoder for a body framed as `kind`; a chunked body's trailer section is held to the
    /// head's `limits` (its size and field count).
    pub fn new(kind: BodyKind, limits: &Limits) -> Self {
        let state = match kind {
            BodyKind::Empty | BodyKind::Length(0) => State::Done,
            BodyKind::Length(remaining) => State::Length { remaining },
            BodyKind::Chunked => SIZE_LINE_START,
        };
        Self {
            state,
            limits: *limits,
        }
    }

    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Consumes framing and at most one contiguous run of body bytes from `input`.
    ///
    /// The caller loops while `!done && consumed > 0`, re-slicing `input` after `consumed`.
    /// `consumed == 0` means the decoder needs more input (or is done).
    pub fn decode(&mut self, input: &[u8]) -> Result<Decoded, HttpError> {
        let mut at = 0;
        loop {
            let remaining = match self.state {
                State::Done => {
                    return Ok(Decoded {
                        consumed: at,
                        data: at..at,
                        done: true,
                    })
                }
                State::Length { remaining } | State::Data { remaining } => remaining,
                _ => {
                    let Some(&byte) = input.get(at) else {
                        return Ok(Decoded {
                            consumed: at,
                            data: at..at,
                            done: false,
                        });
                    };
                    self.state = framing_step(self.state, byte, &self.limits)?;
                    at += 1;
                    continue;
                }
            };
            let available = input.len() - at;
            let n = usize::try_from(remaining).map_or(available, |r| r.min(available));
            if n == 0 {
                return Ok(Decoded {
                    consumed: at,
                    data: at..at,
                    done: false,
                });
            }
            let left = remaining - n as u64;
            self.state = match (self.state, left) {
                (State::Length { .. }, 0) => State::Done,
                (State::Length { .. }, _) => State::Length { remaining: left },
                (_, 0) => State::DataEnd { seen_cr: false },
                (_, _) => State::Data { remaining: left },
            };
            return Ok(Decoded {
                consumed: at + n,
                data: at..at + n,
                done: self.is_done(),
            });
        }
    }
}

/// The transition on one framing byte (any state but `Length`, `Data` and `Done`).
fn framing_step(state: State, byte: u8, limits: &Limits) -> Result<State, HttpError> {
    match state {
        State::Size {
            size,
            has_digit,
            phase,
            line_len,
        } => size_step(size, has_digit, phase, line_len, byte),
        State::DataEnd { seen_cr: false } if byte == b'\r' => Ok(State::DataEnd { seen_cr: true }),
        State::DataEnd { seen_cr: true } if byte == b'\n' => Ok(SIZE_LINE_START),
        State::DataEnd { .. } => Err(BAD_DATA_END),
        State::Trailers {
            total,
            fields,
            phase,
        } => trailer_step(total, fields, phase, byte, limits),
        State::Length { .. } | State::Data { .. } | State::Done => {
            unreachable!("framing_step is only called in a framing state, not {state:?}")
        }
    }
}

/// The transition on one byte of the trailer section: the head's field rules (see the module
/// documentation) and limits. The size limit is checked first, at the byte that exceeds it.
fn trailer_step(
    total: usize,
    fields: usize,
    phase: TrailerPhase,
    byte: u8,
    limits: &Limits,
) -> Result<State, HttpError> {
    let total = total + 1;
    if total > limits.max_head_bytes {
        return Err(TRAILERS_TOO_LARGE);
    }
    let to = |fields, phase| {
        Ok(State::Trailers {
            total,
            fields,
            phase,
        })
    };
    match (phase, byte) {
        (TrailerPhase::LineStart, b'\r') => to(fields, TrailerPhase::EndLf),
        (TrailerPhase::LineStart, b' ' | b'\t') => Err(FOLDED_TRAILER),
        (TrailerPhase::LineStart | TrailerPhase::Name, _) if is_tchar(byte) => {
            to(fields, TrailerPhase::Name)
        }
        // The colon, or a value byte: HTAB, SP, visible ASCII, obs-text.
        (TrailerPhase::Name, b':') | (TrailerPhase::Value, b'\t' | b' '..=b'~' | 0x80..=0xff) => {
            to(fields, TrailerPhase::Value)
        }
        (TrailerPhase::LineStart | TrailerPhase::Name, _) => Err(BAD_TRAILER_NAME),
        (TrailerPhase::Value, b'\r') => to(fields, TrailerPhase::LineLf),
        (TrailerPhase::Value, b'\n') => Err(BAD_TRAILER_LINE_END),
        (TrailerPhase::Value, _) => Err(BAD_TRAILER_VALUE),
        (TrailerPhase::LineLf, b'\n') if fields >= limits.max_headers => Err(TOO_MANY_TRAILERS),
        (TrailerPhase::LineLf, b'\n') => to(fields + 1, TrailerPhase::LineStart),
        (TrailerPhase::EndLf, b'\n') => Ok(State::Done),
        (TrailerPhase::LineLf | TrailerPhase::EndLf, _) => Err(BAD_TRAILER_LINE_END),
    }
}

/// The transition on one byte of a chunk-size line.
fn size_step(
    size: u64,
    has_digit: bool,
    phase: SizePhase,
    line_len: usize,
    byte: u8,
) -> Result<State, HttpError> {
    let next = |size, phase| {
        let line_len = line_len + 1;
        if line_len > MAX_SIZE_LINE {
            return Err(SIZE_LINE_TOO_LONG);
        }
        Ok(State::Size {
            size,
            has_digit: true,
            phase,
            line_len,
        })
    };
    match (phase, byte) {
        (SizePhase::Lf, b'\n') if size == 0 => Ok(TRAILERS_START),
        (SizePhase::Lf, b'\n') => Ok(State::Data { remaining: size }),
        (SizePhase::Lf, _) => Err(BAD_SIZE_LINE_END),
        (SizePhase::Digits, _) if byte.is_ascii_hexdigit() => {
            let digit = u64::from(hex_value(byte));
            let size = size
                .checked_mul(16)
                .and_then(|s| s.checked_add(digit))
                .ok_or(BAD_CHUNK_SIZE)?;
            next(size, SizePhase::Digits)
        }
        (SizePhase::Digits, b' ' | b'\t' | b';' | b'\r') if !has_digit => Err(BAD_CHUNK_SIZE),
        (SizePhase::Digits | SizePhase::Space, b' ' | b'\t') => next(size, SizePhase::Space),
        (SizePhase::Digits | SizePhase::Space | SizePhase::Extension, b'\r') => Ok(State::Size {
            size,
            has_digit,
            phase: SizePhase::Lf,
            line_len,
        }),
        (SizePhase::Digits | SizePhase::Space, b';') => next(size, SizePhase::Extension),
        (SizePhase::Digits | SizePhase::Space, _) => Err(BAD_CHUNK_SIZE),
        (SizePhase::Extension, b'\t' | b' '..=b'~' | 0x80..=0xff) => {
            next(size, SizePhase::Extension)
        }
        (SizePhase::Extension, _) => Err(BAD_CHUNK_EXTENSION),
    }
}

fn hex_value(byte: u8) -> u8 {
    match byte {
        b'0'..=b'9' => byte - b'0',
        b'a'..=b'f' => byte - b'a' + 10,
        _ => byte - b'A' + 10,
    }
}

#[cfg(test)]
mod tests;
