//! Table-driven: every body is decoded from its input whole, byte by byte, and followed by a
//! pipelined request that must be left untouched.

use super::*;
use crate::http::request::{parse_head, Head, Limits};

const NEXT: &[u8] = b"GET /next HTTP/1.1\r\nHost: h\r\n\r\n";

/// What decoding a whole input produced.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    body: Vec<u8>,
    consumed: usize,
    done: bool,
}

/// Feeds `chunks` in turn to one decoder the way the connection layer does: bytes not consumed
/// stay pending and are offered again with the next read.
fn feed<'a>(
    kind: BodyKind,
    limits: &Limits,
    chunks: impl Iterator<Item = &'a [u8]>,
) -> Result<Outcome, HttpError> {
    let mut decoder = BodyDecoder::new(kind, limits);
    let mut pending = Vec::new();
    let mut out = Outcome {
        body: Vec::new(),
        consumed: 0,
        done: decoder.is_done(),
    };
    for chunk in chunks {
        pending.extend_from_slice(chunk);
        loop {
            let d = decoder.decode(&pending)?;
            assert!(
                d.data.start <= d.data.end && d.data.end <= d.consumed,
                "{d:?}"
            );
            assert!(
                d.consumed > 0 || d.done || pending.is_empty(),
                "stalled with input: {d:?}"
            );
            assert_eq!(d.done, decoder.is_done());
            out.body.extend_from_slice(&pending[d.data.clone()]);
            out.consumed += d.consumed;
            out.done = d.done;
            pending.drain(..d.consumed);
            if d.done || d.consumed == 0 {
                break;
            }
        }
        if out.done {
            break;
        }
    }
    Ok(out)
}

/// Decodes `input` three ways under the default limits and returns the agreed outcome.
fn decode3(kind: BodyKind, input: &[u8]) -> Result<Outcome, HttpError> {
    decode3_with(kind, &Limits::default(), input)
}

/// Decodes `input` three ways under `limits`: whole, byte by byte, and followed by a pipelined
/// request that must be left untouched; returns the agreed outcome.
fn decode3_with(kind: BodyKind, limits: &Limits, input: &[u8]) -> Result<Outcome, HttpError> {
    let show = String::from_utf8_lossy(input);
    let whole = feed(kind, limits, std::iter::once(input));
    let bytewise = feed(kind, limits, input.chunks(1));
    assert_eq!(whole, bytewise, "whole vs byte by byte: {show:?}");
    let with_next = [input, NEXT].concat();
    let trailing = feed(kind, limits, std::iter::once(&with_next[..]));
    match (&whole, trailing) {
        (Ok(want), Ok(got)) if want.done => {
            assert_eq!(*want, got, "with trailing data: {show:?}");
            assert_eq!(
                got.consumed,
                input.len(),
                "did not stop at the end of the body: {show:?}"
            );
        }
        (Ok(_), _) => {} // incomplete: the next request would be read as body
        (Err(want), got) => assert_eq!(Err(want.clone()), got, "with trailing data: {show:?}"),
    }
    whole
}

#[test]
fn bodies_decode_to_their_bytes() {
    use BodyKind::{Chunked, Empty, Length};
    let long_ext = format!("3;{}\r\nabc\r\n0\r\n\r\n", "e".repeat(1022));
    let cases: &[(&str, BodyKind, &[u8], &[u8])] = &[
        ("empty", Empty, b"", b""),
        ("length zero", Length(0), b"", b""),
        ("length", Length(5), b"hello", b"hello"),
        ("length with CRLF inside", Length(4), b"a\r\nb", b"a\r\nb"),
        ("one chunk", Chunked, b"5\r\nhello\r\n0\r\n\r\n", b"hello"),
        ("no chunks", Chunked, b"0\r\n\r\n", b""),
        (
            "two chunks",
            Chunked,
            b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
            b"hello world",
        ),
        (
            "uppercase hex",
            Chunked,
            b"A\r\n0123456789\r\n0\r\n\r\n",
            b"0123456789",
        ),
        (
            "lowercase hex",
            Chunked,
            b"a\r\n0123456789\r\n0\r\n\r\n",
            b"0123456789",
        ),
        (
            "leading zeros",
            Chunked,
            b"0003\r\nabc\r\n000\r\n\r\n",
            b"abc",
        ),
        (
            "extensions",
            Chunked,
            b"3;name=value\r\nabc\r\n2 ; a ; b=\"q;\\\"x\" \r\nde\r\n0;last\r\n\r\n",
            b"abcde",
        ),
        (
            "space before CRLF",
            Chunked,
            b"3 \t \r\nabc\r\n0\r\n\r\n",
            b"abc",
        ),
        (
            "trailers",
            Chunked,
            b"3\r\nabc\r\n0\r\nX-Checksum: 1\r\nY: 2\r\n\r\n",
            b"abc",
        ),
        (
            "size line at the limit",
            Chunked,
            long_ext.as_bytes(),
            b"abc",
        ),
        (
            "chunk holding CRLF",
            Chunked,
            b"4\r\n\r\n\r\n\r\n0\r\n\r\n",
            b"\r\n\r\n",
        ),
    ];
    for &(name, kind, input, body) in cases {
        let got = decode3(kind, input).unwrap_or_else(|e| panic!("{name}: {e:?}"));
        assert_eq!(
            got,
            Outcome {
                body: body.to_vec(),
                consumed: input.len(),
                done: true
            },
            "{name}"
        );
    }
}

#[test]
fn incomplete_bodies_wait_for_more() {
    use BodyKind::{Chunked, Length};
    let cases: &[(BodyKind, &[u8], &[u8])] = &[
        (Length(10), b"hello", b"hello"),
        (Chunked, b"", b""),
        (Chunked, b"5", b""),
        (Chunked, b"5;ext", b""),
        (Chunked, b"5\r", b""),
        (Chunked, b"5\r\nhel", b"hel"),
        (Chunked, b"5\r\nhello", b"hello"),
        (Chunked, b"5\r\nhello\r", b"hello"),
        (Chunked, b"5\r\nhello\r\n0\r\n", b"hello"),
        (Chunked, b"5\r\nhello\r\n0\r\nX: 1\r\n", b"hello"),
        (Chunked, b"5\r\nhello\r\n0\r\n\r", b"hello"),
    ];
    for &(kind, input, body) in cases {
        let got = decode3(kind, input).unwrap();
        assert_eq!(
            got,
            Outcome {
                body: body.to_vec(),
                consumed: input.len(),
                done: false
            }
        );
    }
}

#[test]
fn bad_chunked_framing_is_rejected() {
    let long_ext = format!("3;{}\r\nabc\r\n0\r\n\r\n", "e".repeat(1023));
    // The trailer section is everything after "0\r\n": "X: " + value + "\r\n\r\n"; its limit is
    // the head's (max_head_bytes, 65536 by default).
    let max_trailers = format!("0\r\nX: {}\r\n\r\n", "t".repeat(65536 - 7));
    let long_trailers = format!("0\r\nX: {}\r\n\r\n", "t".repeat(65536 - 6));
    let cases: &[(&str, &[u8], u16)] = &[
        ("empty size", b"\r\n", 400),
        ("extension without size", b";a\r\n", 400),
        ("space before size", b" 5\r\nhello\r\n0\r\n\r\n", 400),
        ("not hex", b"g\r\n", 400),
        ("sign", b"-5\r\n", 400),
        ("0x prefix", b"0x5\r\n", 400),
        ("space inside size", b"1 0\r\n", 400),
        ("overflow", b"10000000000000000\r\n", 400),
        ("bare LF after size", b"5\nhello\r\n0\r\n\r\n", 400),
        ("CR not followed by LF", b"5\rhello", 400),
        (
            "control byte in extension",
            b"5;\x01\r\nhello\r\n0\r\n\r\n",
            400,
        ),
        ("LF in extension", b"5;a\nhello", 400),
        ("size line too long", long_ext.as_bytes(), 400),
        ("data longer than size", b"3\r\nabcd\r\n0\r\n\r\n", 400),
        ("bare LF after data", b"3\r\nabc\n0\r\n\r\n", 400),
        ("no CRLF after data", b"3\r\nabc0\r\n\r\n", 400),
        ("bare LF in trailers", b"0\r\nX: 1\n\r\n", 400),
        ("bare LF ending trailers", b"0\r\n\n", 400),
        ("CR alone in trailers", b"0\r\nX: 1\rY\r\n\r\n", 400),
        ("trailers too large", long_trailers.as_bytes(), 431),
    ];
    for &(name, input, status) in cases {
        match decode3(BodyKind::Chunked, input) {
            Err(err) => assert_eq!(err.status, status, "{name}: {err:?}"),
            Ok(got) => panic!("{name}: expected {status}, got {got:?}"),
        }
    }
    assert!(
        decode3(BodyKind::Chunked, max_trailers.as_bytes())
            .unwrap()
            .done
    );
}

#[test]
fn largest_chunk_size_is_accepted() {
    let mut decoder = BodyDecoder::new(BodyKind::Chunked, &Limits::default());
    let d = decoder.decode(b"ffffffffffffffff\r\nxy").unwrap();
    assert_eq!((d.consumed, d.data, d.done), (20, 18..20, false));
    assert_eq!(
        format!("{decoder:?}"),
        format!(
            "BodyDecoder {{ state: Data {{ remaining: {} }}, limits: {:?} }}",
            u64::MAX - 2,
            Limits::default()
        )
    );
}

#[test]
fn decoding_after_done_consumes_nothing() {
    let mut decoder = BodyDecoder::new(BodyKind::Length(2), &Limits::default());
    assert_eq!(
        decoder.decode(b"abGET").unwrap(),
        Decoded {
            consumed: 2,
            data: 0..2,
            done: true
        }
    );
    assert_eq!(
        decoder.decode(b"GET").unwrap(),
        Decoded {
            consumed: 0,
            data: 0..0,
            done: true
        }
    );
    let mut decoder = BodyDecoder::new(BodyKind::Empty, &Limits::default());
    assert!(decoder.is_done());
    assert_eq!(
        decoder.decode(b"GET").unwrap(),
        Decoded {
            consumed: 0,
            data: 0..0,
            done: true
        }
    );
}

/// Three requests in one read: a Content-Length body, a chunked body, and a bodiless GET.
#[test]
fn pipelined_requests_with_bodies() {
    let mut buf = b"POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhelloPOST /b HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3;x\r\nabc\r\n0\r\nT: 1\r\n\r\nGET /c HTTP/1.1\r\nHost: h\r\n\r\n".to_vec();
    let limits = Limits::default();
    let mut head = Head::default();
    let mut at = 0;
    let mut seen = Vec::new();
    while at < buf.len() {
        assert_eq!(parse_head(&mut buf[at..], &limits, &mut head), Ok(true));
        let target = buf[at..][head.target.clone()].to_vec();
        at += head.head_len;
        let mut decoder = BodyDecoder::new(head.body, &limits);
        let mut body = Vec::new();
        loop {
            let d = decoder.decode(&buf[at..]).unwrap();
            body.extend_from_slice(&buf[at..][d.data.clone()]);
            at += d.consumed;
            if d.done || d.consumed == 0 {
                break;
            }
        }
        assert!(decoder.is_done());
        seen.push((
            String::from_utf8(target).unwrap(),
            String::from_utf8(body).unwrap(),
        ));
    }
    let want = [("/a", "hello"), ("/b", "abc"), ("/c", "")];
    assert_eq!(seen, want.map(|(t, b)| (t.to_owned(), b.to_owned())));
}

/// Trailer lines that break the header-field rules (RFC 9110 §5.1, RFC 9112 §5.1, §5.2). Each
/// one is fed three ways by `decode3`, and behind a complete request by
/// `bad_trailers_stop_a_pipelined_stream`.
const BAD_TRAILERS: &[(&str, &[u8])] = &[
    ("no colon", b"0\r\nnocolon\r\n\r\n"),
    ("empty name", b"0\r\n: v\r\n\r\n"),
    ("NUL in a value", b"0\r\nX: a\0b\r\n\r\n"),
    ("NUL in a name", b"0\r\nX\0Y: v\r\n\r\n"),
    ("control byte in a value", b"0\r\nX: a\x01b\r\n\r\n"),
    ("DEL in a value", b"0\r\nX: a\x7fb\r\n\r\n"),
    ("space before the colon", b"0\r\nX : v\r\n\r\n"),
    ("tab before the colon", b"0\r\nX\t: v\r\n\r\n"),
    ("space in a name", b"0\r\nX Y: v\r\n\r\n"),
    ("separator in a name", b"0\r\nX(Y): v\r\n\r\n"),
    ("obs-fold", b"0\r\nX: a\r\n b\r\n\r\n"),
    ("obs-fold with a tab", b"0\r\nX: a\r\n\tb\r\n\r\n"),
    ("whitespace before the first line", b"0\r\n X: v\r\n\r\n"),
    ("request line", b"0\r\nGET /smuggled HTTP/1.1\r\n\r\n"),
    (
        "request with a host",
        b"0\r\nGET /smuggled HTTP/1.1\r\nHost: h\r\n\r\n",
    ),
    ("bare LF ending a line", b"0\r\nX: 1\n\r\n"),
    ("bare LF ending the section", b"0\r\nX: 1\r\n\n"),
    ("bare CR in a value", b"0\r\nX: 1\rY\r\n\r\n"),
    ("CR in a name", b"0\r\nX\r\n\r\n"),
];

#[test]
fn malformed_trailers_are_rejected() {
    for &(name, trailers) in BAD_TRAILERS {
        let input = [&b"3\r\nabc\r\n"[..], trailers].concat();
        match decode3(BodyKind::Chunked, &input) {
            Err(err) => assert_eq!(err.status, 400, "{name}: {err:?}"),
            Ok(got) => panic!("{name}: expected 400, got {got:?}"),
        }
    }
}

/// A bad trailer in the second of three pipelined requests: the first is decoded, the error
/// stops the stream at the second, and the third is never reached.
#[test]
fn bad_trailers_stop_a_pipelined_stream() {
    let limits = Limits::default();
    for &(name, trailers) in BAD_TRAILERS {
        let mut buf = [
            &b"POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nT: 1\r\n\r\n"[..],
            b"POST /b HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n",
            trailers,
            NEXT,
        ]
        .concat();
        let mut head = Head::default();
        let mut at = 0;
        let mut bodies = Vec::new();
        let error = loop {
            assert_eq!(
                parse_head(&mut buf[at..], &limits, &mut head),
                Ok(true),
                "{name}"
            );
            at += head.head_len;
            let mut decoder = BodyDecoder::new(head.body, &limits);
            let mut body = Vec::new();
            let result = loop {
                match decoder.decode(&buf[at..]) {
                    Ok(d) => {
                        body.extend_from_slice(&buf[at..][d.data.clone()]);
                        at += d.consumed;
                        if d.done || d.consumed == 0 {
                            break Ok(d.done);
                        }
                    }
                    Err(err) => break Err(err),
                }
            };
            match result {
                Ok(true) => bodies.push(body),
                Ok(false) => panic!("{name}: incomplete"),
                Err(err) => break err,
            }
        };
        assert_eq!(
            (bodies, error.status),
            (vec![b"ok".to_vec()], 400),
            "{name}"
        );
    }
}

#[test]
fn well_formed_trailers_are_accepted_and_discarded() {
    let cases: &[(&str, &[u8])] = &[
        ("one field", b"0\r\nX-Checksum: 1\r\n\r\n"),
        ("empty value", b"0\r\nX:\r\n\r\n"),
        ("no space after the colon", b"0\r\nX:v\r\n\r\n"),
        (
            "spaces and tabs around the value",
            b"0\r\nX: \t v w \t\r\n\r\n",
        ),
        ("colon in the value", b"0\r\nX: a:b: c\r\n\r\n"),
        (
            "every token character",
            b"0\r\n!#$%&'*+-.^_`|~09AZaz: v\r\n\r\n",
        ),
        ("visible ASCII", b"0\r\nX: !\"#()<>@[]{}\\/?=~\r\n\r\n"),
        ("obs-text", b"0\r\nX: caf\xe9 \xff\x80\r\n\r\n"),
        ("several fields", b"0\r\nA: 1\r\nB: 2\r\nA: 3\r\n\r\n"),
    ];
    for &(name, trailers) in cases {
        let input = [&b"3\r\nabc\r\n"[..], trailers].concat();
        let got = decode3(BodyKind::Chunked, &input).unwrap_or_else(|e| panic!("{name}: {e:?}"));
        let want = Outcome {
            body: b"abc".to_vec(),
            consumed: input.len(),
            done: true,
        };
        assert_eq!(got, want, "{name}");
    }
}

#[test]
fn trailers_get_the_head_limits_at_the_same_byte_however_split() {
    let small = Limits {
        max_head_bytes: 32,
        max_headers: 2,
        max_uri_bytes: 8,
    };
    // The section is what follows "0\r\n", its final empty line included.
    let at_size = b"0\r\nX: 0123456789012345678901234\r\n\r\n";
    assert_eq!(at_size.len() - 3, 32);
    let over_size = b"0\r\nX: 01234567890123456789012345\r\n\r\n";
    assert_eq!(over_size.len() - 3, 33);
    let cases: &[(&str, &[u8], Option<u16>)] = &[
        ("section at the size limit", at_size, None),
        ("section one byte over", over_size, Some(431)),
        ("fields at the limit", b"0\r\nA: 1\r\nB: 2\r\n\r\n", None),
        (
            "one field too many",
            b"0\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n",
            Some(431),
        ),
        // An endless line is cut at the limit: byte 33 of the section.
        (
            "endless value",
            b"0\r\nX: 0123456789012345678901234567890123456789",
            Some(431),
        ),
        // An error before the limit wins over it.
        (
            "bad byte before the size limit",
            b"0\r\nX: 0\x0012345678901234567890123456789\r\n\r\n",
            Some(400),
        ),
        (
            "bad third line",
            b"0\r\nA: 1\r\nB: 2\r\nC : 3\r\n\r\n",
            Some(400),
        ),
    ];
    for &(name, input, status) in cases {
        match (decode3_with(BodyKind::Chunked, &small, input), status) {
            (Ok(got), None) => assert!(got.done, "{name}: {got:?}"),
            (Err(err), Some(status)) => assert_eq!(err.status, status, "{name}: {err:?}"),
            (got, _) => panic!("{name}: expected {status:?}, got {got:?}"),
        }
    }
    let mut decoder = BodyDecoder::new(BodyKind::Chunked, &small);
    let err = decoder.decode(over_size).unwrap_err();
    assert!(err.reason.contains("--limit-header-size"), "{err:?}");
    let mut decoder = BodyDecoder::new(BodyKind::Chunked, &small);
    let err = decoder
        .decode(b"0\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n")
        .unwrap_err();
    assert!(err.reason.contains("--limit-headers"), "{err:?}");
}

/// The trailer rules are the head's: on random trailer sections (CRLF line ends; the head
/// allows bare LF, the chunked framing does not), the decoder accepts exactly what `httparse`
/// accepts as a header section, and ends where it ends.
#[test]
fn trailer_rules_agree_with_the_head_parser() {
    const ALPHABET: &[u8] = b"Xy-9!~:: \t\t\0\x01\x7f\x80\xff\r\n\"(;";
    let mut rng = crate::test_rng::Rng(0x7a11_e125_5eed_0001);
    let mut outcomes = [0usize; 2];
    for _ in 0..20_000 {
        let mut section = Vec::new();
        for _ in 0..rng.below(4) {
            let len = rng.below(10);
            section.extend((0..len).map(|_| ALPHABET[rng.below(ALPHABET.len())]));
            section.extend_from_slice(b"\r\n");
        }
        section.extend_from_slice(b"\r\n");
        let bare_lf = section
            .iter()
            .enumerate()
            .any(|(i, &b)| b == b'\n' && (i == 0 || section[i - 1] != b'\r'));
        if bare_lf {
            continue;
        }
        let mut slots = [httparse::EMPTY_HEADER; 16];
        let want = match httparse::parse_headers(&section, &mut slots) {
            Ok(httparse::Status::Complete((n, _))) => Some(n),
            Ok(httparse::Status::Partial) => None,
            Err(_) => Some(usize::MAX),
        };
        let input = [&b"0\r\n"[..], &section].concat();
        let got = match feed(
            BodyKind::Chunked,
            &Limits::default(),
            std::iter::once(&input[..]),
        ) {
            Ok(out) if out.done => Some(out.consumed - 3),
            Ok(_) => None,
            Err(err) => {
                assert_eq!(err.status, 400, "{err:?}");
                Some(usize::MAX)
            }
        };
        assert_eq!(got, want, "{:?}", String::from_utf8_lossy(&section));
        outcomes[usize::from(want == Some(usize::MAX))] += 1;
    }
    // Both verdicts are common.
    assert!(outcomes.iter().all(|&n| n > 2000), "{outcomes:?}");
}
