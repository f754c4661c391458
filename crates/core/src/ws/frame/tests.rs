//! Table-driven: every client byte stream is decoded whole, byte by byte, and followed by the
//! next frame (a ping), which must not change what came before; the three must agree.

use super::*;

/// The masking key of the RFC 6455 §5.7 examples.
pub(super) const MASK: [u8; 4] = [0x37, 0xfa, 0x21, 0x3d];
pub(super) const FIN: u8 = 0x80;
pub(super) const CONT: u8 = 0x0;
pub(super) const TEXT: u8 = 0x1;
pub(super) const BINARY: u8 = 0x2;
pub(super) const CLOSE: u8 = 0x8;
pub(super) const PING: u8 = 0x9;
pub(super) const PONG: u8 = 0xa;
/// Byte 1: the MASK bit, and the 7-bit lengths that announce a 16-bit or 64-bit length.
pub(super) const MASKED: u8 = 0x80;
pub(super) const LEN_16: u8 = 0x7e;
pub(super) const LEN_64: u8 = 0x7f;
/// A frame behind each case: legal anywhere, even between fragments.
const NEXT_PING: &[u8] = b"next";
pub(super) const BIG: usize = 1 << 20;

/// A client frame: `b0` (FIN, RSV bits, opcode) as given, the shortest length encoding,
/// `payload` masked with `mask` (sent unmasked when `None`).
pub(super) fn frame_with(b0: u8, payload: &[u8], mask: Option<[u8; 4]>) -> Vec<u8> {
    let mut out = vec![b0];
    let mask_bit = if mask.is_some() { MASKED } else { 0 };
    match payload.len() {
        n @ 0..=125 => out.push(mask_bit | n as u8),
        n @ 126..=0xffff => {
            out.push(mask_bit | LEN_16);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(mask_bit | LEN_64);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    match mask {
        Some(key) => {
            out.extend_from_slice(&key);
            out.extend(payload.iter().zip(key.iter().cycle()).map(|(b, k)| b ^ k));
        }
        None => out.extend_from_slice(payload),
    }
    out
}

/// A client frame masked with [`MASK`].
pub(super) fn frame(b0: u8, payload: &[u8]) -> Vec<u8> {
    frame_with(b0, payload, Some(MASK))
}

pub(super) fn close_frame(code: u16, reason: &[u8]) -> Vec<u8> {
    frame(FIN | CLOSE, &[&code.to_be_bytes()[..], reason].concat())
}

/// What decoding a stream produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Outcome {
    /// Each event, with the total consumed when it was returned (the end of its last frame).
    pub(super) events: Vec<(usize, Event)>,
    /// The total consumed at the end, or the error that ended decoding.
    pub(super) end: Result<usize, ProtocolError>,
}

/// Feeds `chunks` in turn to one decoder the way the connection layer does: bytes not consumed
/// stay pending and are offered again with the next read.
fn feed<'a>(mut decoder: Decoder, chunks: impl Iterator<Item = &'a [u8]>) -> Outcome {
    let (mut pending, mut consumed, mut events) = (Vec::new(), 0, Vec::new());
    for chunk in chunks {
        pending.extend_from_slice(chunk);
        loop {
            match decoder.decode(&pending) {
                Err(err) => {
                    assert_eq!(decoder.decode(&pending), Err(err), "an error is final");
                    assert!(err.reason.len() <= 123, "{err}");
                    return Outcome {
                        events,
                        end: Err(err),
                    };
                }
                Ok((n, event)) => {
                    assert!(n <= pending.len());
                    pending.drain(..n);
                    consumed += n;
                    match event {
                        Some(event) => events.push((consumed, event)),
                        None if n == 0 => break,
                        None => {}
                    }
                }
            }
        }
        let closed = matches!(events.last(), Some((_, Event::Close { .. })));
        // It stops only for an incomplete header, or after the close frame.
        assert!(
            closed || pending.len() < 14,
            "stalled with {} bytes",
            pending.len()
        );
    }
    Outcome {
        events,
        end: Ok(consumed),
    }
}

/// Decodes `input` three ways and returns the agreed outcome.
pub(super) fn decode3(max: usize, input: &[u8]) -> Outcome {
    decode3_with(&|| Decoder::new(max), input)
}

/// [`decode3`] with decoders made by `new` (one per way).
pub(super) fn decode3_with(new: &dyn Fn() -> Decoder, input: &[u8]) -> Outcome {
    let whole = feed(new(), std::iter::once(input));
    let bytewise = feed(new(), input.chunks(1));
    assert_eq!(whole, bytewise, "whole vs byte by byte: {input:02x?}");

    let next = frame(FIN | PING, NEXT_PING);
    let with_next = [input, &next].concat();
    let trailing = feed(new(), std::iter::once(&with_next[..]));
    let closed = matches!(whole.events.last(), Some((_, Event::Close { .. })));
    let mut want = whole.clone();
    if let (Ok(n), false) = (whole.end, closed) {
        assert_eq!(n, input.len(), "incomplete input in a three-way case");
        let end = n + next.len();
        want.events.push((end, Event::Ping(NEXT_PING.to_vec())));
        want.end = Ok(end);
    }
    assert_eq!(trailing, want, "with the next frame behind: {input:02x?}");
    whole
}

pub(super) fn text(s: &str) -> Event {
    Event::Text(s.as_bytes().to_vec())
}

pub(super) fn close(code: u16, reason: &str) -> Event {
    Event::Close {
        code: Some(code),
        reason: reason.to_owned(),
    }
}

/// 0, 1, .. 250, 0, 1, ..: bytes that differ from their neighbours and from the key.
pub(super) fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

/// Decodes each case three ways and checks it yields exactly `events`, consuming all of it.
fn expect_events(cases: Vec<(&str, Vec<u8>, Vec<Event>)>) {
    for (name, input, events) in cases {
        let got = decode3(BIG, &input);
        assert_eq!(got.end, Ok(input.len()), "{name}");
        let got: Vec<Event> = got.events.into_iter().map(|(_, e)| e).collect();
        assert_eq!(got, events, "{name}");
    }
}

#[test]
fn single_frames_decode_to_their_events() {
    expect_events(vec![
        (
            "RFC 5.7: masked text Hello",
            vec![
                0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58,
            ],
            vec![text("Hello")],
        ),
        (
            "RFC 5.7: fragmented text Hel + lo",
            [frame(TEXT, b"Hel"), frame(FIN | CONT, b"lo")].concat(),
            vec![text("Hello")],
        ),
        (
            "RFC 5.7: ping Hello",
            frame(FIN | PING, b"Hello"),
            vec![Event::Ping(b"Hello".to_vec())],
        ),
        (
            "RFC 5.7: masked pong Hello",
            vec![
                0x8a, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58,
            ],
            vec![Event::Pong(b"Hello".to_vec())],
        ),
        (
            "RFC 5.7: 256 bytes binary, 16-bit length",
            frame(FIN | BINARY, &pattern(256)),
            vec![Event::Binary(pattern(256))],
        ),
        (
            "RFC 5.7: 64 KiB binary, 64-bit length",
            frame(FIN | BINARY, &pattern(65536)),
            vec![Event::Binary(pattern(65536))],
        ),
        (
            "125 bytes, 7-bit length",
            frame(FIN | BINARY, &pattern(125)),
            vec![Event::Binary(pattern(125))],
        ),
        (
            "126 bytes, 16-bit length",
            frame(FIN | BINARY, &pattern(126)),
            vec![Event::Binary(pattern(126))],
        ),
        (
            "65535 bytes, 16-bit length",
            frame(FIN | BINARY, &pattern(65535)),
            vec![Event::Binary(pattern(65535))],
        ),
        (
            "length in more bytes than needed",
            [
                vec![FIN | BINARY, MASKED | LEN_16, 0, 3],
                MASK.to_vec(),
                vec![0x37 ^ 1, 0xfa ^ 2, 0x21 ^ 3],
            ]
            .concat(),
            vec![Event::Binary(vec![1, 2, 3])],
        ),
        ("empty text", frame(FIN | TEXT, b""), vec![text("")]),
        (
            "empty binary",
            frame(FIN | BINARY, b""),
            vec![Event::Binary(vec![])],
        ),
        (
            "empty ping",
            frame(FIN | PING, b""),
            vec![Event::Ping(vec![])],
        ),
        (
            "ping of 125 bytes",
            frame(FIN | PING, &pattern(125)),
            vec![Event::Ping(pattern(125))],
        ),
        (
            "zero mask",
            frame_with(FIN | TEXT, b"plain", Some([0; 4])),
            vec![text("plain")],
        ),
    ]);
}

#[test]
fn fragmented_messages_decode_whole() {
    let big_text = "é€a𝄞".repeat(10_000);
    expect_events(vec![
        (
            "control frames between fragments",
            [
                frame(TEXT, b"Hel"),
                frame(FIN | PING, b"p"),
                frame(FIN | PONG, b"q"),
                frame(FIN | CONT, b"lo"),
            ]
            .concat(),
            vec![
                Event::Ping(b"p".to_vec()),
                Event::Pong(b"q".to_vec()),
                text("Hello"),
            ],
        ),
        (
            "empty fragments",
            [
                frame(BINARY, b""),
                frame(CONT, b"ab"),
                frame(CONT, b""),
                frame(FIN | CONT, b""),
            ]
            .concat(),
            vec![Event::Binary(b"ab".to_vec())],
        ),
        (
            "3-byte character split across fragments",
            [
                frame(TEXT, b"a\xe2"),
                frame(CONT, b"\x82"),
                frame(FIN | CONT, b"\xacb"),
            ]
            .concat(),
            vec![text("a€b")],
        ),
        (
            "4-byte character in four fragments",
            [
                frame(TEXT, b"\xf0"),
                frame(CONT, b"\x9d"),
                frame(CONT, b"\x84"),
                frame(FIN | CONT, b"\x9e"),
            ]
            .concat(),
            vec![text("𝄞")],
        ),
        (
            "large multibyte text",
            frame(FIN | TEXT, big_text.as_bytes()),
            vec![text(&big_text)],
        ),
        (
            "messages back to back",
            [
                frame(FIN | TEXT, b"a"),
                frame(FIN | BINARY, &[1, 2]),
                frame(FIN | TEXT, b"b"),
            ]
            .concat(),
            vec![text("a"), Event::Binary(vec![1, 2]), text("b")],
        ),
    ]);
}

#[test]
fn close_frames_decode_to_code_and_reason() {
    let reason_123 = "r".repeat(123);
    expect_events(vec![
        (
            "close without payload",
            frame(FIN | CLOSE, b""),
            vec![Event::Close {
                code: None,
                reason: String::new(),
            }],
        ),
        (
            "close with code only",
            close_frame(1000, b""),
            vec![close(1000, "")],
        ),
        (
            "close with code and reason",
            close_frame(1001, b"bye"),
            vec![close(1001, "bye")],
        ),
        (
            "close with UTF-8 reason",
            close_frame(4999, "é".as_bytes()),
            vec![close(4999, "é")],
        ),
        ("close 3000", close_frame(3000, b""), vec![close(3000, "")]),
        (
            "close 1012 (IANA)",
            close_frame(1012, b""),
            vec![close(1012, "")],
        ),
        (
            "close with a 123-byte reason",
            close_frame(1000, reason_123.as_bytes()),
            vec![close(1000, &reason_123)],
        ),
        (
            "close between fragments",
            [frame(TEXT, b"Hel"), close_frame(1000, b"")].concat(),
            vec![close(1000, "")],
        ),
    ]);
}

#[test]
fn every_close_code_outside_section_7_4_is_refused() {
    for code in 0..=u16::MAX {
        let valid = matches!(code, 1000..=1003 | 1007..=1014 | 3000..=4999);
        let mut decoder = Decoder::new(BIG);
        let input = close_frame(code, b"");
        match decoder.decode(&input) {
            Ok((n, Some(event))) if valid => {
                assert_eq!((n, event), (input.len(), close(code, "")));
            }
            Err(err) if !valid => assert_eq!(err, BAD_CLOSE_CODE, "{code}"),
            other => panic!("{code}: {other:?}"),
        }
    }
}

/// Decodes each case three ways and checks it fails with `code`.
fn expect_errors(cases: Vec<(String, Vec<u8>, u16)>) {
    for (name, input, code) in cases {
        let got = decode3(BIG, &input);
        let err = got.end.expect_err(&name);
        assert_eq!(err.code, code, "{name}: {err}");
    }
}

#[test]
fn framing_violations_are_1002() {
    let mut cases: Vec<(String, Vec<u8>, u16)> = vec![
        (
            "unmasked frame".into(),
            frame_with(FIN | TEXT, b"hi", None),
            1002,
        ),
        ("RSV1".into(), frame(FIN | 0x40 | TEXT, b"hi"), 1002),
        ("RSV2".into(), frame(FIN | 0x20 | BINARY, b"hi"), 1002),
        ("RSV3".into(), frame(FIN | 0x10 | PING, b""), 1002),
        ("fragmented ping".into(), frame(PING, b""), 1002),
        ("fragmented pong".into(), frame(PONG, b"x"), 1002),
        ("fragmented close".into(), frame(CLOSE, b""), 1002),
        (
            "ping of 126 bytes".into(),
            frame(FIN | PING, &[0; 126]),
            1002,
        ),
        (
            "close of 126 bytes".into(),
            close_frame(1000, &[b'r'; 124]),
            1002,
        ),
        ("continuation first".into(), frame(FIN | CONT, b"x"), 1002),
        (
            "unfinished continuation first".into(),
            frame(CONT, b"x"),
            1002,
        ),
        (
            "continuation after a finished message".into(),
            [frame(FIN | TEXT, b"a"), frame(FIN | CONT, b"b")].concat(),
            1002,
        ),
        (
            "text inside a fragmented message".into(),
            [frame(TEXT, b"a"), frame(FIN | TEXT, b"b")].concat(),
            1002,
        ),
        (
            "binary inside a fragmented text".into(),
            [frame(TEXT, b"a"), frame(BINARY, b"b")].concat(),
            1002,
        ),
        (
            "64-bit length with the high bit set".into(),
            [
                vec![FIN | BINARY, MASKED | LEN_64, 0x80, 0, 0, 0, 0, 0, 0, 1],
                MASK.to_vec(),
            ]
            .concat(),
            1002,
        ),
        ("close with 1 byte".into(), frame(FIN | CLOSE, &[3]), 1002),
    ];
    for opcode in (3..=7).chain(11..=15) {
        cases.push((
            format!("reserved opcode {opcode}"),
            frame(FIN | opcode, b""),
            1002,
        ));
    }
    expect_errors(cases);
}

#[test]
fn invalid_utf8_is_1007() {
    expect_errors(vec![
        (
            "invalid byte 0xff".into(),
            frame(FIN | TEXT, b"ok\xff"),
            1007,
        ),
        (
            "lone continuation byte".into(),
            frame(FIN | TEXT, b"\x80"),
            1007,
        ),
        ("overlong NUL".into(), frame(FIN | TEXT, b"\xc0\x80"), 1007),
        ("surrogate".into(), frame(FIN | TEXT, b"\xed\xa0\x80"), 1007),
        (
            "above U+10FFFF".into(),
            frame(FIN | TEXT, b"\xf4\x90\x80\x80"),
            1007,
        ),
        (
            "text ends inside a character".into(),
            frame(FIN | TEXT, b"a\xe2\x82"),
            1007,
        ),
        (
            "fragmented text ends inside a character".into(),
            [frame(TEXT, b"\xe2"), frame(FIN | CONT, b"\x82")].concat(),
            1007,
        ),
        (
            "invalid first fragment fails before the message ends".into(),
            frame(TEXT, b"\xff"),
            1007,
        ),
        (
            "character broken across fragments".into(),
            [frame(TEXT, b"\xe2"), frame(FIN | CONT, b"a")].concat(),
            1007,
        ),
        (
            "close reason not UTF-8".into(),
            close_frame(1000, b"\xff"),
            1007,
        ),
        (
            "close reason ends inside a character".into(),
            close_frame(1000, b"\xc3"),
            1007,
        ),
    ]);
}

#[test]
fn first_error_in_stream_order_wins() {
    // RSV bit (byte 0) before the missing mask (byte 1); the mask before a control length.
    let cases: &[(&[u8], ProtocolError)] = &[
        (&[0xc1, 0x05], RESERVED_BITS),
        (&[0x89, 0x7e], UNMASKED),
        (&[0x09, 0xfe], FRAGMENTED_CONTROL),
        (&[0x89, 0xfe], CONTROL_TOO_LONG),
        (&[0x82, 0xff, 0x80, 0, 0, 0, 0, 0, 0, 0], LENGTH_HIGH_BIT),
    ];
    for &(input, want) in cases {
        assert_eq!(decode3(16, input).end, Err(want), "{input:02x?}");
    }
}
