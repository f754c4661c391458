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
fn feed<'a>(kind: BodyKind, chunks: impl Iterator<Item = &'a [u8]>) -> Result<Outcome, HttpError> {
    let mut decoder = BodyDecoder::new(kind);
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

/// Decodes `input` three ways and returns the agreed outcome.
fn decode3(kind: BodyKind, input: &[u8]) -> Result<Outcome, HttpError> {
    let show = String::from_utf8_lossy(input);
    let whole = feed(kind, std::iter::once(input));
    let bytewise = feed(kind, input.chunks(1));
    assert_eq!(whole, bytewise, "whole vs byte by byte: {show:?}");
    let with_next = [input, NEXT].concat();
    let trailing = feed(kind, std::iter::once(&with_next[..]));
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
    // The trailer section is everything after "0\r\n": "X: " + value + "\r\n\r\n".
    let max_trailers = format!("0\r\nX: {}\r\n\r\n", "t".repeat(8192 - 7));
    let long_trailers = format!("0\r\nX: {}\r\n\r\n", "t".repeat(8192 - 6));
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
    let mut decoder = BodyDecoder::new(BodyKind::Chunked);
    let d = decoder.decode(b"ffffffffffffffff\r\nxy").unwrap();
    assert_eq!((d.consumed, d.data, d.done), (20, 18..20, false));
    assert_eq!(
        format!("{decoder:?}"),
        format!(
            "BodyDecoder {{ state: Data {{ remaining: {} }} }}",
            u64::MAX - 2
        )
    );
}

#[test]
fn decoding_after_done_consumes_nothing() {
    let mut decoder = BodyDecoder::new(BodyKind::Length(2));
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
    let mut decoder = BodyDecoder::new(BodyKind::Empty);
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
        let mut decoder = BodyDecoder::new(head.body);
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
