//! The decoder with permessage-deflate negotiated: compressed messages (RSV1 on the first frame)
//! decode to the same events as uncompressed ones, whole, byte by byte and followed by another
//! frame. Payloads are the RFC 7692 §7.2.3 examples, or made by [`Compressor`] as a client's
//! compressor would make them.

use super::tests::{
    decode3, decode3_with, frame, pattern, text, Outcome, BIG, BINARY, CLOSE, CONT, FIN, PING,
    PONG, TEXT,
};
use super::*;
use crate::test_rng::Rng;

/// RFC 7692 §7.2.3.1: "Hello" compressed.
const HELLO: &[u8] = b"\xf2\x48\xcd\xc9\xc9\x07\x00";
/// RFC 7692 §7.2.3.2: "Hello" again, as a back-reference to the first (context takeover).
const HELLO_AGAIN: &[u8] = b"\xf2\x00\x11\x00\x00";

/// A bare `permessage-deflate` offer's parameters: context kept on both sides.
const TAKEOVER: DeflateParams = DeflateParams {
    server_no_context_takeover: false,
    client_no_context_takeover: false,
    server_max_window_bits: None,
    client_max_window_bits: None,
};
const NO_TAKEOVER: DeflateParams = DeflateParams {
    client_no_context_takeover: true,
    ..TAKEOVER
};

/// `decode3` with a decoder that negotiated `params`.
fn inflate3(params: DeflateParams, max: usize, input: &[u8]) -> Outcome {
    decode3_with(&|| Decoder::with_deflate(max, &params), input)
}

/// The payloads a client's compressor sends for `messages`, its context kept across them unless
/// `params.client_no_context_takeover`.
fn client_payloads(params: DeflateParams, messages: &[&[u8]]) -> Vec<Vec<u8>> {
    let client = DeflateParams {
        server_no_context_takeover: params.client_no_context_takeover,
        ..TAKEOVER
    };
    crate::ws::deflate::tests::compress_all(client, messages)
}

/// A compressed message: `payload` in frames cut at `cuts`, RSV1 on the first only.
fn compressed(opcode: u8, payload: &[u8], cuts: &[usize]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, &end) in cuts.iter().chain([&payload.len()]).enumerate() {
        let first = if i == 0 { RSV1 | opcode } else { CONT };
        let fin = if i == cuts.len() { FIN } else { 0 };
        out.extend(frame(fin | first, &payload[start..end]));
        start = end;
    }
    out
}

fn expect_events(cases: Vec<(&str, DeflateParams, Vec<u8>, Vec<Event>)>) {
    for (name, params, input, events) in cases {
        let got = inflate3(params, BIG, &input);
        assert_eq!(got.end, Ok(input.len()), "{name}");
        let got: Vec<Event> = got.events.into_iter().map(|(_, e)| e).collect();
        assert!(got == events, "{name}");
    }
}

#[test]
fn rfc_7692_examples_decode() {
    expect_events(vec![
        (
            "7.2.3.1: Hello in one frame (its payload is not UTF-8, and is not checked as such)",
            TAKEOVER,
            compressed(TEXT, HELLO, &[]),
            vec![text("Hello")],
        ),
        (
            "7.2.3.1: Hello in two fragments",
            TAKEOVER,
            compressed(TEXT, HELLO, &[3]),
            vec![text("Hello")],
        ),
        (
            "7.2.3.2: the second Hello refers back to the first",
            TAKEOVER,
            [
                compressed(TEXT, HELLO, &[]),
                compressed(TEXT, HELLO_AGAIN, &[]),
            ]
            .concat(),
            vec![text("Hello"), text("Hello")],
        ),
        (
            "7.2.3.3: a stored (uncompressed) block",
            TAKEOVER,
            compressed(TEXT, b"\x00\x05\x00\xfa\xffHello\x00", &[]),
            vec![text("Hello")],
        ),
        (
            "7.2.3.4: a final block, then a new stream",
            TAKEOVER,
            [
                compressed(TEXT, b"\xf3\x48\xcd\xc9\xc9\x07\x00\x00", &[]),
                compressed(TEXT, HELLO, &[]),
            ]
            .concat(),
            vec![text("Hello"), text("Hello")],
        ),
        (
            "7.2.3.5: two blocks in one message",
            TAKEOVER,
            compressed(
                TEXT,
                b"\xf2\x48\x05\x00\x00\x00\xff\xff\xca\xc9\xc9\x07\x00",
                &[],
            ),
            vec![text("Hello")],
        ),
        (
            "an uncompressed message between compressed ones keeps the context",
            TAKEOVER,
            [
                compressed(TEXT, HELLO, &[]),
                frame(FIN | BINARY, &[1, 2]),
                compressed(TEXT, HELLO_AGAIN, &[]),
            ]
            .concat(),
            vec![text("Hello"), Event::Binary(vec![1, 2]), text("Hello")],
        ),
        (
            "an empty payload is an empty message and leaves the context as it was",
            TAKEOVER,
            [
                compressed(TEXT, HELLO, &[]),
                compressed(BINARY, b"", &[]),
                compressed(TEXT, HELLO_AGAIN, &[]),
            ]
            .concat(),
            vec![text("Hello"), Event::Binary(vec![]), text("Hello")],
        ),
    ]);
}

#[test]
fn compressed_messages_decode_like_uncompressed_ones() {
    // 1 MiB (the limit): compressible, then noise.
    let big = [&pattern(BIG - 4_096)[..], &Rng(7).bytes(4_096)].concat();
    let multibyte = "é€a𝄞".repeat(1_000);
    let messages: [&[u8]; 6] = [
        b"Hello",
        b"",
        multibyte.as_bytes(),
        &big,
        b"Hello",
        &[0, 1, 2, 3],
    ];
    for params in [TAKEOVER, NO_TAKEOVER] {
        let payloads = client_payloads(params, &messages);
        let [hello, empty, multi, big_p, hello_again, bin] = &payloads[..] else {
            unreachable!()
        };
        let mid = multi.len() / 2;
        let input = [
            compressed(TEXT, hello, &[]),
            compressed(TEXT, empty, &[]),
            // Cut anywhere in the compressed bytes, with a control frame between fragments.
            frame(RSV1 | TEXT, &multi[..1]),
            frame(FIN | PING, b"p"),
            frame(CONT, &multi[1..mid]),
            frame(FIN | CONT, &multi[mid..]),
            compressed(BINARY, big_p, &[100, big_p.len() - 1]),
            frame(FIN | PONG, b"q"),
            compressed(TEXT, hello_again, &[hello_again.len()]),
            compressed(BINARY, bin, &[0]),
        ]
        .concat();
        let events = vec![
            text("Hello"),
            text(""),
            Event::Ping(b"p".to_vec()),
            text(&multibyte),
            Event::Binary(big.clone()),
            Event::Pong(b"q".to_vec()),
            text("Hello"),
            Event::Binary(vec![0, 1, 2, 3]),
        ];
        expect_events(vec![("client's compressor", params, input, events)]);
    }
}

#[test]
fn client_no_context_takeover_forgets_the_previous_message() {
    let input = [
        compressed(TEXT, HELLO, &[]),
        compressed(TEXT, HELLO_AGAIN, &[]),
    ]
    .concat();
    let got = inflate3(NO_TAKEOVER, BIG, &input);
    let first_end = compressed(TEXT, HELLO, &[]).len();
    assert_eq!(got.events, vec![(first_end, text("Hello"))]);
    assert_eq!(got.end, Err(BAD_DEFLATE));
}

/// A case that must fail: its name, the decoder's extension (`None`: no extension), its limit,
/// the input and the error.
type ErrorCase<'a> = (
    &'a str,
    Option<DeflateParams>,
    usize,
    Vec<u8>,
    ProtocolError,
);

/// Decodes each case three ways and checks it ends with its error.
fn expect_errors(cases: Vec<ErrorCase>) {
    for (name, params, max, input, want) in cases {
        let got = match params {
            Some(params) => inflate3(params, max, &input),
            None => decode3(max, &input),
        };
        assert_eq!(got.end, Err(want), "{name}");
    }
}

#[test]
fn rsv_bits_outside_a_compressed_first_frame_are_1002() {
    let deflate = Some(TAKEOVER);
    expect_errors(vec![
        (
            "RSV1 without the extension",
            None,
            BIG,
            compressed(TEXT, HELLO, &[]),
            RESERVED_BITS,
        ),
        (
            "RSV1 on a continuation of a compressed message",
            deflate,
            BIG,
            [
                frame(RSV1 | TEXT, &HELLO[..3]),
                frame(FIN | RSV1 | CONT, &HELLO[3..]),
            ]
            .concat(),
            RSV1_NOT_FIRST,
        ),
        (
            "RSV1 on a continuation of an uncompressed message",
            deflate,
            BIG,
            [frame(TEXT, b"Hel"), frame(FIN | RSV1 | CONT, HELLO)].concat(),
            RSV1_NOT_FIRST,
        ),
        (
            "RSV1 on a ping",
            deflate,
            BIG,
            frame(FIN | RSV1 | PING, b""),
            RSV1_NOT_FIRST,
        ),
        (
            "RSV1 on a pong between fragments",
            deflate,
            BIG,
            [
                frame(RSV1 | TEXT, &HELLO[..3]),
                frame(FIN | RSV1 | PONG, b""),
            ]
            .concat(),
            RSV1_NOT_FIRST,
        ),
        (
            "RSV1 on a close",
            deflate,
            BIG,
            frame(FIN | RSV1 | CLOSE, b""),
            RSV1_NOT_FIRST,
        ),
        (
            "RSV2 with the extension",
            deflate,
            BIG,
            frame(FIN | 0x20 | TEXT, b"hi"),
            RSV2_RSV3_SET,
        ),
        (
            "RSV3 with the extension",
            deflate,
            BIG,
            frame(FIN | 0x10 | BINARY, b"hi"),
            RSV2_RSV3_SET,
        ),
        (
            "RSV1 and RSV2",
            deflate,
            BIG,
            frame(FIN | 0x60 | TEXT, HELLO),
            RSV2_RSV3_SET,
        ),
        (
            "RSV1 on a reserved opcode",
            deflate,
            BIG,
            frame(FIN | RSV1 | 0x3, b""),
            RESERVED_OPCODE,
        ),
    ]);
}

#[test]
fn corrupt_data_is_1002_bad_text_1007_and_too_much_1009() {
    let payloads = client_payloads(
        TAKEOVER,
        &[b"ok\xff", b"a\xe2\x82", &[b'x'; 1_000], &vec![0; 10 << 20]],
    );
    let [bad_utf8, cut_char, thousand, bomb] = &payloads[..] else {
        unreachable!()
    };
    assert!(bomb.len() < 16 << 10, "{} bytes", bomb.len());
    let deflate = Some(TAKEOVER);
    expect_errors(vec![
        (
            "corrupt deflate data",
            deflate,
            BIG,
            compressed(BINARY, b"\xff\xff\xff", &[]),
            BAD_DEFLATE,
        ),
        (
            "stored block with a bad NLEN in the second fragment",
            deflate,
            BIG,
            compressed(BINARY, b"\x00\x05\x00\x00\x00hello", &[3]),
            BAD_DEFLATE,
        ),
        (
            "back-reference before the start of the stream",
            deflate,
            BIG,
            compressed(TEXT, HELLO_AGAIN, &[]),
            BAD_DEFLATE,
        ),
        (
            "invalid UTF-8 once inflated",
            deflate,
            BIG,
            compressed(TEXT, bad_utf8, &[]),
            BAD_TEXT,
        ),
        (
            "text ending inside a character once inflated",
            deflate,
            BIG,
            compressed(TEXT, cut_char, &[2]),
            BAD_TEXT,
        ),
        (
            "inflated one byte over the limit",
            deflate,
            999,
            compressed(BINARY, thousand, &[]),
            MESSAGE_TOO_BIG,
        ),
        (
            "compressed bytes over the limit, refused at the header",
            deflate,
            4,
            compressed(TEXT, HELLO, &[]),
            MESSAGE_TOO_BIG,
        ),
        (
            "10 MiB of zeros in a few KiB, against 64 KiB",
            deflate,
            64 << 10,
            compressed(BINARY, bomb, &[bomb.len() / 2]),
            MESSAGE_TOO_BIG,
        ),
    ]);
    // At the limit it passes.
    let got = inflate3(TAKEOVER, 1_000, &compressed(BINARY, thousand, &[]));
    assert_eq!(got.end.map(|_| got.events.len()), Ok(1));
}
