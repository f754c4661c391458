//! Negotiation from offers as clients send them, the answer's text, and the compressor and
//! inflater against an independent inflater and each other. The decoder's use of the inflater is
//! tested in `frame/deflate_tests.rs`.

use super::*;

use crate::test_rng::Rng;

/// What a bare `permessage-deflate` offer negotiates.
const DEFAULT: DeflateParams = DeflateParams {
    server_no_context_takeover: false,
    client_no_context_takeover: false,
    server_max_window_bits: None,
    client_max_window_bits: None,
};

#[test]
fn acceptable_offers_negotiate_and_are_answered() {
    let cases: &[(&str, &[&[u8]], DeflateParams, &str)] = &[
        (
            "browser (Chrome): client_max_window_bits without a value",
            &[b"permessage-deflate; client_max_window_bits"],
            DEFAULT,
            "permessage-deflate",
        ),
        (
            "bare offer (Firefox, Safari)",
            &[b"permessage-deflate"],
            DEFAULT,
            "permessage-deflate",
        ),
        (
            "websockets-style: both window sizes",
            &[b"permessage-deflate; client_max_window_bits=12; server_max_window_bits=12"],
            DeflateParams {
                server_max_window_bits: Some(12),
                client_max_window_bits: Some(12),
                ..DEFAULT
            },
            "permessage-deflate; server_max_window_bits=12; client_max_window_bits=12",
        ),
        (
            "both no_context_takeover",
            &[b"permessage-deflate; client_no_context_takeover; server_no_context_takeover"],
            DeflateParams {
                server_no_context_takeover: true,
                client_no_context_takeover: true,
                ..DEFAULT
            },
            "permessage-deflate; server_no_context_takeover; client_no_context_takeover",
        ),
        (
            "every parameter",
            &[
                b"permessage-deflate; server_no_context_takeover; client_no_context_takeover; \
                server_max_window_bits=9; client_max_window_bits=8",
            ],
            DeflateParams {
                server_no_context_takeover: true,
                client_no_context_takeover: true,
                server_max_window_bits: Some(9),
                client_max_window_bits: Some(8),
            },
            "permessage-deflate; server_no_context_takeover; client_no_context_takeover; \
             server_max_window_bits=9; client_max_window_bits=8",
        ),
        (
            "server_no_context_takeover with a smaller window",
            &[b"permessage-deflate; server_no_context_takeover; client_max_window_bits=12"],
            DeflateParams {
                server_no_context_takeover: true,
                client_max_window_bits: Some(12),
                ..DEFAULT
            },
            "permessage-deflate; server_no_context_takeover; client_max_window_bits=12",
        ),
        (
            "server_max_window_bits=15, the default window, is echoed all the same",
            &[b"permessage-deflate; server_max_window_bits=15"],
            DeflateParams {
                server_max_window_bits: Some(15),
                ..DEFAULT
            },
            "permessage-deflate; server_max_window_bits=15",
        ),
    ];
    expect_negotiated(cases);
}

#[test]
fn fallbacks_quoted_values_and_whitespace_negotiate() {
    let cases: &[(&str, &[&[u8]], DeflateParams, &str)] = &[
        (
            "first offer declined (server window 8), the fallback taken",
            &[b"permessage-deflate; server_max_window_bits=8, permessage-deflate; client_max_window_bits"],
            DEFAULT,
            "permessage-deflate",
        ),
        (
            "first offer with an unknown parameter, the second taken",
            &[b"permessage-deflate; x-unknown, permessage-deflate; server_no_context_takeover"],
            DeflateParams {
                server_no_context_takeover: true,
                ..DEFAULT
            },
            "permessage-deflate; server_no_context_takeover",
        ),
        (
            "other extensions before and after, across header values",
            &[
                b"x-webkit-deflate-frame",
                b"foo; bar=1, permessage-deflate; server_max_window_bits=10, baz",
            ],
            DeflateParams {
                server_max_window_bits: Some(10),
                ..DEFAULT
            },
            "permessage-deflate; server_max_window_bits=10",
        ),
        (
            "quoted values",
            &[b"permessage-deflate; server_max_window_bits=\"11\"; client_max_window_bits=\"1\\2\""],
            DeflateParams {
                server_max_window_bits: Some(11),
                client_max_window_bits: Some(12),
                ..DEFAULT
            },
            "permessage-deflate; server_max_window_bits=11; client_max_window_bits=12",
        ),
        (
            "a quoted comma does not split offers; that offer is declined",
            &[b"permessage-deflate; client_max_window_bits=\"1,2\", permessage-deflate"],
            DEFAULT,
            "permessage-deflate",
        ),
        (
            "a quoted comma hides what looks like an offer",
            &[b"foo; a=\", permessage-deflate, \", permessage-deflate; server_no_context_takeover"],
            DeflateParams {
                server_no_context_takeover: true,
                ..DEFAULT
            },
            "permessage-deflate; server_no_context_takeover",
        ),
        (
            "a quoted semicolon stays in its value; that offer is declined",
            &[b"foo; a=\";permessage-deflate\", permessage-deflate; client_max_window_bits=9"],
            DeflateParams {
                client_max_window_bits: Some(9),
                ..DEFAULT
            },
            "permessage-deflate; client_max_window_bits=9",
        ),
        (
            "optional whitespace everywhere",
            &[b" ,\tpermessage-deflate ;  client_max_window_bits = 10 ;server_no_context_takeover\t"],
            DeflateParams {
                server_no_context_takeover: true,
                client_max_window_bits: Some(10),
                ..DEFAULT
            },
            "permessage-deflate; server_no_context_takeover; client_max_window_bits=10",
        ),
        (
            "an empty header value before the offer",
            &[b"", b"permessage-deflate"],
            DEFAULT,
            "permessage-deflate",
        ),
    ];
    expect_negotiated(cases);
}

/// Checks that each case's header values negotiate its parameters, answered with its text.
fn expect_negotiated(cases: &[(&str, &[&[u8]], DeflateParams, &str)]) {
    for &(name, values, want, answer) in cases {
        let got = DeflateParams::negotiate(values.iter().copied());
        assert_eq!(got, Some(want), "{name}");
        assert_eq!(want.response_value(), answer, "{name}");
    }
}

#[test]
fn unacceptable_offers_are_declined() {
    let cases: &[(&str, &[&[u8]])] = &[
        ("no header", &[]),
        ("empty header", &[b""]),
        ("empty list elements", &[b" , ,\t"]),
        (
            "other extensions only",
            &[b"x-webkit-deflate-frame, foo; bar"],
        ),
        ("name is matched exactly", &[b"Permessage-Deflate"]),
        ("longer name", &[b"permessage-deflate-x"]),
        ("unknown parameter", &[b"permessage-deflate; mem_level=5"]),
        ("empty parameter", &[b"permessage-deflate;"]),
        (
            "server_no_context_takeover twice",
            &[b"permessage-deflate; server_no_context_takeover; server_no_context_takeover"],
        ),
        (
            "client_max_window_bits twice, with and without a value",
            &[b"permessage-deflate; client_max_window_bits; client_max_window_bits=10"],
        ),
        (
            "server_max_window_bits twice",
            &[b"permessage-deflate; server_max_window_bits=10; server_max_window_bits=10"],
        ),
        (
            "server_no_context_takeover with a value",
            &[b"permessage-deflate; server_no_context_takeover=true"],
        ),
        (
            "client_no_context_takeover with a value",
            &[b"permessage-deflate; client_no_context_takeover=\"\""],
        ),
        (
            "server_max_window_bits without a value",
            &[b"permessage-deflate; server_max_window_bits"],
        ),
        (
            "server_max_window_bits=8: zlib cannot compress with it",
            &[b"permessage-deflate; server_max_window_bits=8"],
        ),
        (
            "server_max_window_bits=16",
            &[b"permessage-deflate; server_max_window_bits=16"],
        ),
        (
            "client_max_window_bits=7",
            &[b"permessage-deflate; client_max_window_bits=7"],
        ),
        (
            "leading zero",
            &[b"permessage-deflate; client_max_window_bits=09"],
        ),
        ("sign", &[b"permessage-deflate; server_max_window_bits=+9"]),
        (
            "not a number",
            &[b"permessage-deflate; client_max_window_bits=ten"],
        ),
        (
            "empty value",
            &[b"permessage-deflate; client_max_window_bits="],
        ),
        (
            "empty quoted value",
            &[b"permessage-deflate; client_max_window_bits=\"\""],
        ),
        (
            "unterminated quoted value",
            &[b"permessage-deflate; client_max_window_bits=\"10"],
        ),
        (
            "quoted value with text after the quote",
            &[b"permessage-deflate; client_max_window_bits=\"10\"x"],
        ),
        (
            "quoted value that is not a token",
            &[b"permessage-deflate; client_max_window_bits=\"1 0\""],
        ),
        (
            "every offer declined",
            &[
                b"permessage-deflate; server_max_window_bits=8",
                b"permessage-deflate; foo",
            ],
        ),
    ];
    for &(name, values) in cases {
        assert_eq!(
            DeflateParams::negotiate(values.iter().copied()),
            None,
            "{name}"
        );
    }
}

/// Compresses each message with a fresh `out` per message.
pub(crate) fn compress_all(params: DeflateParams, messages: &[&[u8]]) -> Vec<Vec<u8>> {
    let mut compressor = Compressor::new(&params);
    messages
        .iter()
        .map(|message| {
            let mut out = Vec::new();
            compressor.compress(message, &mut out);
            out
        })
        .collect()
}

/// Inflates one payload as RFC 7692 §7.2.2 says, with flate2 directly (not [`Inflater`]).
fn reference_inflate(inflater: &mut Decompress, payload: &[u8]) -> Vec<u8> {
    let input = [payload, &TAIL].concat();
    let mut out = Vec::with_capacity(64);
    let mut at = 0;
    loop {
        out.reserve(out.len() + 64);
        let before = inflater.total_in();
        inflater
            .decompress_vec(&input[at..], &mut out, FlushDecompress::Sync)
            .expect("valid deflate data");
        at += (inflater.total_in() - before) as usize;
        if at == input.len() && out.len() < out.capacity() {
            return out;
        }
    }
}

/// Text with repeats, 1 MiB of noise, and the awkward sizes.
fn sample_messages() -> Vec<Vec<u8>> {
    let mut rng = Rng(0x0def_1a7e);
    vec![
        b"Hello".to_vec(),
        b"Hello".to_vec(),
        Vec::new(),
        b"Hello".to_vec(),
        "the quick brown fox jumps over the lazy dog; "
            .repeat(1_000)
            .into_bytes(),
        Vec::new(),
        rng.bytes(1 << 20),
        (0..1 << 20).map(|i| (i / 1_000) as u8).collect(),
        vec![b'x'],
    ]
}

#[test]
fn compressed_messages_inflate_with_an_independent_inflater() {
    let messages = sample_messages();
    let messages: Vec<&[u8]> = messages.iter().map(Vec::as_slice).collect();
    for takeover in [true, false] {
        let params = DeflateParams {
            server_no_context_takeover: !takeover,
            ..DEFAULT
        };
        let payloads = compress_all(params, &messages);
        let mut shared = Decompress::new_with_window_bits(false, 15);
        for (message, payload) in messages.iter().zip(&payloads) {
            // No payload ends with the tail it is sent without; an empty message is one byte.
            assert!(!payload.ends_with(&TAIL), "{takeover}");
            assert!(!payload.is_empty(), "{takeover}");
            let got = if takeover {
                reference_inflate(&mut shared, payload)
            } else {
                // Each message stands alone: a fresh inflater reads it.
                reference_inflate(&mut Decompress::new_with_window_bits(false, 15), payload)
            };
            assert!(
                got == *message,
                "takeover {takeover}: {} bytes",
                message.len()
            );
        }
        // With the context, the second "Hello" is a back-reference to the first.
        if takeover {
            assert!(payloads[1].len() < payloads[0].len(), "{payloads:02x?}");
        } else {
            assert_eq!(payloads[1], payloads[0]);
        }
    }
}

#[test]
fn compress_appends_to_out() {
    let mut compressor = Compressor::new(&DEFAULT);
    let mut out = b"head".to_vec();
    compressor.compress(b"Hello", &mut out);
    // RFC 7692 section 7.2.3.1: "Hello" compressed, as zlib writes it.
    assert_eq!(out, b"head\xf2\x48\xcd\xc9\xc9\x07\x00");
}

#[test]
fn a_smaller_server_window_is_kept_across_resets() {
    // Noise repeated 1,000 bytes apart: a 15-bit window finds the repeats, a 9-bit one (512
    // bytes) cannot, so its output is no smaller than the message. (An inflater with a 9-bit
    // window would not tell: zlib-rs resolves such a distance all the same.)
    let block: Vec<u8> = Rng(9).bytes(1_000);
    let message = [&block[..], &block[..], &block[..]].concat();
    let wide = compress_all(DEFAULT, &[&message]);
    assert!(wide[0].len() < 1_200, "{} bytes", wide[0].len());
    for no_takeover in [false, true] {
        let params = DeflateParams {
            server_no_context_takeover: no_takeover,
            server_max_window_bits: Some(9),
            ..DEFAULT
        };
        let payloads = compress_all(params, &[&message, &message]);
        let mut inflater = Decompress::new_with_window_bits(false, 15);
        for payload in &payloads {
            assert!(payload.len() >= message.len(), "{} bytes", payload.len());
            assert_eq!(reference_inflate(&mut inflater, payload), message);
        }
    }
}

/// Inflates each payload in turn with one [`Inflater`].
fn inflate_all(
    params: DeflateParams,
    max: usize,
    payloads: &[Vec<u8>],
) -> Vec<Result<Vec<u8>, InflateError>> {
    let mut inflater = Inflater::new(params.client_no_context_takeover);
    payloads
        .iter()
        .map(|payload| {
            let mut out = Vec::new();
            inflater.inflate(payload, max, &mut out).map(|()| out)
        })
        .collect()
}

#[test]
fn the_inflater_reads_what_the_compressor_writes() {
    let messages = sample_messages();
    let messages: Vec<&[u8]> = messages.iter().map(Vec::as_slice).collect();
    for no_takeover in [false, true] {
        let params = DeflateParams {
            server_no_context_takeover: no_takeover,
            client_no_context_takeover: no_takeover,
            ..DEFAULT
        };
        let payloads = compress_all(params, &messages);
        let got = inflate_all(params, 1 << 20, &payloads);
        for (got, message) in got.into_iter().zip(&messages) {
            assert!(got.as_deref() == Ok(message), "{no_takeover}");
        }
    }
}

#[test]
fn client_no_context_takeover_resets_the_inflater() {
    // RFC 7692 section 7.2.3.2: the second "Hello" refers back to the first.
    let payloads = [
        b"\xf2\x48\xcd\xc9\xc9\x07\x00".to_vec(),
        b"\xf2\x00\x11\x00\x00".to_vec(),
    ];
    let hello = Ok(b"Hello".to_vec());
    let takeover = inflate_all(DEFAULT, 100, &payloads);
    assert_eq!(takeover, [hello.clone(), hello.clone()]);
    let params = DeflateParams {
        client_no_context_takeover: true,
        ..DEFAULT
    };
    let reset = inflate_all(params, 100, &payloads);
    assert_eq!(reset, [hello, Err(InflateError::Corrupt)]);
}

#[test]
fn inflated_size_is_limited_exactly() {
    let message = vec![7; 65_536];
    let payloads = compress_all(DEFAULT, &[&message]);
    assert_eq!(inflate_all(DEFAULT, 65_536, &payloads), [Ok(message)]);
    assert_eq!(
        inflate_all(DEFAULT, 65_535, &payloads),
        [Err(InflateError::TooBig)]
    );
    let empty = compress_all(DEFAULT, &[b""]);
    assert_eq!(inflate_all(DEFAULT, 0, &empty), [Ok(Vec::new())]);
    let one = compress_all(DEFAULT, &[b"x"]);
    assert_eq!(inflate_all(DEFAULT, 0, &one), [Err(InflateError::TooBig)]);
}

#[test]
fn a_decompression_bomb_stops_at_the_limit_without_allocating_more() {
    let bomb = compress_all(DEFAULT, &[&vec![0; 10 << 20]]).remove(0);
    assert!(bomb.len() < 16 << 10, "{} bytes", bomb.len());
    let max = 64 << 10;
    let mut out = Vec::new();
    let got = Inflater::new(false).inflate(&bomb, max, &mut out);
    assert_eq!(got, Err(InflateError::TooBig));
    assert!(out.capacity() <= max + 1, "capacity {}", out.capacity());
    assert_eq!(out.len(), max + 1);
}

#[test]
fn corrupt_payloads_are_refused() {
    let cases: &[(&str, &[u8])] = &[
        ("reserved block type 3", b"\xff"),
        ("stored block with a bad NLEN", b"\x00\x05\x00\x00\x00hello"),
        (
            "distance past the start of the stream",
            b"\xf2\x00\x11\x00\x00",
        ),
    ];
    for &(name, payload) in cases {
        let got = inflate_all(DEFAULT, 100, &[payload.to_vec()]);
        assert_eq!(got, [Err(InflateError::Corrupt)], "{name}");
    }
}

#[test]
fn a_final_block_ends_the_stream_and_the_next_message_starts_a_new_one() {
    // RFC 7692 section 7.2.3.4: "Hello" in a block with BFINAL set, then the empty stored block's
    // first byte; then "Hello" again, which must not refer to the ended stream.
    let payloads = [
        b"\xf3\x48\xcd\xc9\xc9\x07\x00\x00".to_vec(),
        b"\xf2\x48\xcd\xc9\xc9\x07\x00".to_vec(),
    ];
    let hello = Ok(b"Hello".to_vec());
    assert_eq!(inflate_all(DEFAULT, 100, &payloads), [hello.clone(), hello]);
}
