//! Table-driven: every case is fed whole, byte by byte into one growing buffer (as the connection
//! layer does), and followed by a pipelined request; the three must agree.

use super::*;
use BodyKind::{Chunked, Empty, Length};

/// A pipelined request behind the case. Its `Host` is capitalised so the test can see that
/// parsing the first head did not lowercase anything past `head_len`.
const NEXT: &[u8] = b"GET /next HTTP/1.1\r\nHost: b\r\n\r\n";

/// A parsed head with its ranges resolved, comparable across the three feeds.
#[derive(Debug, PartialEq, Eq)]
struct Parsed {
    method: String,
    target: String,
    path: String,
    query: String,
    version: Version,
    headers: Vec<(String, String)>,
    head_len: usize,
    body: BodyKind,
    keep_alive: bool,
    expect_continue: bool,
    upgrade: bool,
}

fn text(buf: &[u8], range: &Range<usize>) -> String {
    String::from_utf8_lossy(&buf[range.clone()]).into_owned()
}

fn resolve(head: &Head, buf: &[u8]) -> Parsed {
    Parsed {
        method: text(buf, &head.method),
        target: text(buf, &head.target),
        path: text(buf, &head.path),
        query: text(buf, &head.query),
        version: head.version,
        headers: head
            .headers
            .iter()
            .map(|(n, v)| (text(buf, n), text(buf, v)))
            .collect(),
        head_len: head.head_len,
        body: head.body,
        keep_alive: head.keep_alive,
        expect_continue: head.expect_continue,
        upgrade: head.upgrade,
    }
}

/// Feeds `input` three ways and returns the agreed outcome: `Ok(None)` for incomplete.
fn parse3(input: &[u8], limits: &Limits) -> Result<Option<Parsed>, HttpError> {
    let show = String::from_utf8_lossy(input);

    let mut whole = input.to_vec();
    let mut head = Head::default();
    let whole_result = parse_head(&mut whole, limits, &mut head)
        .map(|complete| complete.then(|| resolve(&head, &whole)));

    // Byte by byte: the first answer that is not "incomplete" must be the whole-feed answer,
    // and a complete head must complete exactly at its last byte.
    let mut grown = Vec::new();
    let mut head = Head::default();
    let mut bytewise = Ok(None);
    for &byte in input {
        grown.push(byte);
        match parse_head(&mut grown, limits, &mut head) {
            Ok(false) => {}
            Ok(true) => {
                assert_eq!(grown.len(), input.len(), "completed early: {show:?}");
                bytewise = Ok(Some(resolve(&head, &grown)));
                break;
            }
            Err(err) => {
                bytewise = Err(err);
                break;
            }
        }
    }
    assert_eq!(whole_result, bytewise, "whole vs byte by byte: {show:?}");

    // With a pipelined request behind it: same answer, head_len stops at the boundary, the next
    // request is untouched and parses from there (with a reused Head).
    if whole_result != Ok(None) {
        let mut buf = [input, NEXT].concat();
        let mut head = Head::default();
        let result = parse_head(&mut buf, limits, &mut head)
            .map(|complete| complete.then(|| resolve(&head, &buf)));
        assert_eq!(
            whole_result, result,
            "whole vs with trailing data: {show:?}"
        );
        if let Ok(Some(parsed)) = &result {
            assert_eq!(parsed.head_len, input.len(), "{show:?}");
            assert_eq!(
                &buf[input.len()..],
                NEXT,
                "bytes past the head changed: {show:?}"
            );
            let rest = &mut buf[input.len()..];
            assert_eq!(parse_head(rest, limits, &mut head), Ok(true));
            assert_eq!(text(rest, &head.target), "/next");
            assert_eq!(head.header(rest, b"host"), Some(&b"b"[..]));
        }
    }
    whole_result
}

fn ok(input: &[u8]) -> Parsed {
    match parse3(input, &Limits::default()) {
        Ok(Some(parsed)) => parsed,
        other => panic!("{:?}: {other:?}", String::from_utf8_lossy(input)),
    }
}

#[test]
fn request_line_and_fields_are_ranges_into_the_buffer() {
    let p = ok(b"GET /a/b?x=1&y HTTP/1.1\r\nHost: example.com\r\nX-Mixed-Case:   some value \t\r\nX-Empty:\r\n\r\n");
    assert_eq!(p.method, "GET");
    assert_eq!(p.target, "/a/b?x=1&y");
    assert_eq!(p.path, "/a/b");
    assert_eq!(p.query, "x=1&y");
    assert_eq!(p.version, Version::Http11);
    let fields = [
        ("host", "example.com"),
        ("x-mixed-case", "some value"),
        ("x-empty", ""),
    ];
    let want: Vec<_> = fields
        .iter()
        .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
        .collect();
    assert_eq!(p.headers, want);
    assert_eq!(p.body, BodyKind::Empty);
    assert!(p.keep_alive);
    assert!(!p.expect_continue);
    assert!(!p.upgrade);
}

#[test]
fn an_upgrade_field_is_noted_and_a_reused_head_forgets_it() {
    let limits = Limits::default();
    let upgrade =
        b"GET /ws HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n";
    assert!(parse3(upgrade, &limits).unwrap().unwrap().upgrade);
    let plain = b"GET / HTTP/1.1\r\nHost: h\r\nConnection: upgrade\r\n\r\n";
    assert!(!parse3(plain, &limits).unwrap().unwrap().upgrade);
    // The same Head parses the upgrade, then a plain request: the flag does not linger.
    let mut head = Head::default();
    let mut first = upgrade.to_vec();
    assert_eq!(parse_head(&mut first, &limits, &mut head), Ok(true));
    assert!(head.upgrade);
    let mut second = plain.to_vec();
    assert_eq!(parse_head(&mut second, &limits, &mut head), Ok(true));
    assert!(!head.upgrade);
}

#[test]
fn targets_split_into_path_and_query() {
    let cases: &[(&[u8], &str, &str)] = &[
        (b"GET / HTTP/1.1\r\nHost: h\r\n\r\n", "/", ""),
        (b"GET /? HTTP/1.1\r\nHost: h\r\n\r\n", "/", ""),
        (b"GET /p?a?b HTTP/1.1\r\nHost: h\r\n\r\n", "/p", "a?b"),
        (b"OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n", "*", ""),
        (
            b"GET http://h:8/p?q HTTP/1.1\r\nHost: h\r\n\r\n",
            "http://h:8/p",
            "q",
        ),
        (b"CONNECT h:443 HTTP/1.1\r\nHost: h\r\n\r\n", "h:443", ""),
    ];
    for &(input, path, query) in cases {
        let p = ok(input);
        assert_eq!((p.path.as_str(), p.query.as_str()), (path, query), "{p:?}");
    }
    // No query: the empty range sits at the end of the target.
    let mut buf = b"GET /x HTTP/1.1\r\nHost: h\r\n\r\n".to_vec();
    let mut head = Head::default();
    assert_eq!(
        parse_head(&mut buf, &Limits::default(), &mut head),
        Ok(true)
    );
    assert_eq!(head.query, head.target.end..head.target.end);
}

const FRAMING_CASES: &[(&[u8], BodyKind, bool, bool, Version)] = &[
    (
        b"GET / HTTP/1.1\r\nHost: h\r\n\r\n",
        Empty,
        true,
        false,
        Version::Http11,
    ),
    (
        b"GET / HTTP/1.0\r\n\r\n",
        Empty,
        false,
        false,
        Version::Http10,
    ),
    (
        b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n",
        Empty,
        true,
        false,
        Version::Http10,
    ),
    (
        b"GET / HTTP/1.0\r\nConnection: keep-alive\r\nConnection: close\r\n\r\n",
        Empty,
        false,
        false,
        Version::Http10,
    ),
    (
        b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
        Empty,
        false,
        false,
        Version::Http11,
    ),
    (
        b"GET / HTTP/1.1\r\nHost: h\r\nConnection: Upgrade, CLOSE\r\n\r\n",
        Empty,
        false,
        false,
        Version::Http11,
    ),
    (
        b"GET / HTTP/1.1\r\nHost: h\r\nConnection: closed\r\n\r\n",
        Empty,
        true,
        false,
        Version::Http11,
    ),
    (
        b"POST / HTTP/1.1\r\nHost: h\r\nExpect: 100-Continue\r\nContent-Length: 3\r\n\r\n",
        Length(3),
        true,
        true,
        Version::Http11,
    ),
    (
        b"POST / HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n",
        Length(3),
        false,
        false,
        Version::Http10,
    ),
    (
        b"POST / HTTP/1.1\r\nHost: h\r\nExpect: 100-continue-ish\r\n\r\n",
        Empty,
        true,
        false,
        Version::Http11,
    ),
    (
        b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n",
        Empty,
        true,
        false,
        Version::Http11,
    ),
    (
        b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 42\r\n\r\n",
        Length(42),
        true,
        false,
        Version::Http11,
    ),
    (
        b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5, 5\r\n\r\n",
        Length(5),
        true,
        false,
        Version::Http11,
    ),
    (
        b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\ncontent-length: 5\r\n\r\n",
        Length(5),
        true,
        false,
        Version::Http11,
    ),
    (
        b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 007\r\n\r\n",
        Length(7),
        true,
        false,
        Version::Http11,
    ),
    (
        b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 18446744073709551615\r\n\r\n",
        Length(u64::MAX),
        true,
        false,
        Version::Http11,
    ),
    (
        b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n",
        Chunked,
        true,
        false,
        Version::Http11,
    ),
    (
        b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding:  Chunked \r\n\r\n",
        Chunked,
        true,
        false,
        Version::Http11,
    ),
    (
        b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: ,chunked,\r\n\r\n",
        Chunked,
        true,
        false,
        Version::Http11,
    ),
    (
        b"POST / HTTP/1.0\r\nContent-Length: 2\r\n\r\n",
        Length(2),
        false,
        false,
        Version::Http10,
    ),
    // Leading empty lines and bare-LF line endings, as httparse tolerates them.
    (
        b"\r\n\nGET / HTTP/1.1\r\nHost: h\r\n\r\n",
        Empty,
        true,
        false,
        Version::Http11,
    ),
    (
        b"GET / HTTP/1.1\nHost: a\n\n",
        Empty,
        true,
        false,
        Version::Http11,
    ),
];

#[test]
fn framing_keep_alive_and_expect() {
    // (request, body, keep_alive, expect_continue, version)
    let cases = FRAMING_CASES;
    for &(input, body, keep_alive, expect_continue, version) in cases {
        let p = ok(input);
        assert_eq!(
            (p.body, p.keep_alive, p.expect_continue, p.version),
            (body, keep_alive, expect_continue, version),
            "{:?}",
            String::from_utf8_lossy(input)
        );
    }
}

const REJECTIONS: &[(&str, &[u8], u16)] = &[
    (
        "obs-fold",
        b"GET / HTTP/1.1\r\nHost: h\r\nX-Long: a\r\n b\r\n\r\n",
        400,
    ),
    (
        "obs-fold with tab",
        b"GET / HTTP/1.1\r\nHost: a\r\nX: a\r\n\tb\r\n\r\n",
        400,
    ),
    (
        "whitespace before the first field",
        b"GET / HTTP/1.1\r\n Host: a\r\n\r\n",
        400,
    ),
    (
        "space before colon",
        b"GET / HTTP/1.1\r\nHost: h\r\nHost : a\r\n\r\n",
        400,
    ),
    (
        "space in a name",
        b"GET / HTTP/1.1\r\nHost: h\r\nBad Name: a\r\n\r\n",
        400,
    ),
    ("empty name", b"GET / HTTP/1.1\r\nHost: h\r\n: a\r\n\r\n", 400),
    ("NUL in a value", b"GET / HTTP/1.1\r\nHost: h\r\nX: a\0b\r\n\r\n", 400),
    (
        "bare CR in a value",
        b"GET / HTTP/1.1\r\nHost: h\r\nX: a\rb\r\n\r\n",
        400,
    ),
    ("bad method byte", b"G(T / HTTP/1.1\r\nHost: h\r\n\r\n", 400),
    ("bad target byte", b"GET /a\x01b HTTP/1.1\r\nHost: h\r\n\r\n", 400),
    ("space in the target", b"GET /a b HTTP/1.1\r\nHost: h\r\n\r\n", 400),
    ("two spaces", b"GET  / HTTP/1.1\r\nHost: h\r\n\r\n", 400),
    ("not a version", b"GET / FOO/1.1\r\n\r\n", 400),
    ("missing version", b"GET /\r\n\r\n", 400),
    ("junk after version", b"GET / HTTP/1.1x\r\n\r\n", 400),
    ("HTTP/2.0", b"GET / HTTP/2.0\r\n\r\n", 505),
    ("HTTP/1.2 without a host, as HTTP/1.1", b"GET / HTTP/1.2\r\n\r\n", 400),
    ("HTTP/1.20", b"GET / HTTP/1.20\r\nHost: h\r\n\r\n", 400),
    ("HTTP/1.2x", b"GET / HTTP/1.2x\r\nHost: h\r\n\r\n", 400),
    ("HTTP/2.1", b"GET / HTTP/2.1\r\nHost: h\r\n\r\n", 505),
    ("HTTP/0.9", b"GET / HTTP/0.9\r\n\r\n", 505),
    ("HTTP/3", b"GET / HTTP/3\r\n\r\n", 505),
    (
        "CL and TE",
        b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
        400,
    ),
    (
        "TE and CL",
        b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
        400,
    ),
    (
        "differing CL fields",
        b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
        400,
    ),
    (
        "differing CL list",
        b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3, 4\r\n\r\n",
        400,
    ),
    (
        "CL empty element",
        b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3,,3\r\n\r\n",
        400,
    ),
    (
        "CL empty",
        b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length:\r\n\r\n",
        400,
    ),
    (
        "CL not digits",
        b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: abc\r\n\r\n",
        400,
    ),
    (
        "CL negative",
        b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: -1\r\n\r\n",
        400,
    ),
    (
        "CL plus sign",
        b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: +1\r\n\r\n",
        400,
    ),
    (
        "CL hex",
        b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 0x10\r\n\r\n",
        400,
    ),
    (
        "CL overflow",
        b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 18446744073709551616\r\n\r\n",
        400,
    ),
    (
        "TE in HTTP/1.0",
        b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
        400,
    ),
    (
        "TE final not chunked",
        b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip\r\n\r\n",
        400,
    ),
    (
        "TE chunked then gzip",
        b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
        400,
    ),
    (
        "TE chunked twice",
        b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked, chunked\r\n\r\n",
        400,
    ),
    (
        "TE identity",
        b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: identity\r\n\r\n",
        400,
    ),
    (
        "TE empty",
        b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding:\r\n\r\n",
        400,
    ),
    (
        "TE gzip, chunked",
        b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
        501,
    ),
    ("no host in HTTP/1.1", b"GET / HTTP/1.1\r\n\r\n", 400),
    (
        "two host lines",
        b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
        400,
    ),
    (
        "two equal host lines in HTTP/1.0",
        b"GET / HTTP/1.0\r\nHost: a\r\nHost: a\r\n\r\n",
        400,
    ),
    (
        "TE over two fields",
        b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n",
        501,
    ),
];

/// RFC 9112 §2.3: a request with a higher HTTP/1 minor version is served as HTTP/1.1, the
/// highest this server speaks (with its rules: keep-alive by default, `Host` required).
#[test]
fn higher_http1_minor_versions_are_served_as_http11() {
    let cases: &[(&[u8], bool)] = &[
        (b"GET /a?q HTTP/1.2\r\nHost: h\r\n\r\n", true),
        (b"GET / HTTP/1.9\r\nHost: h\r\n\r\n", true),
        (
            b"GET / HTTP/1.2\r\nHost: h\r\nConnection: close\r\n\r\n",
            false,
        ),
        (
            b"\r\nPOST / HTTP/1.3\r\nHost: h\r\nContent-Length: 3\r\n\r\n",
            true,
        ),
    ];
    for &(input, keep_alive) in cases {
        let p = ok(input);
        assert_eq!(p.version, Version::Http11, "{p:?}");
        assert_eq!(p.keep_alive, keep_alive, "{p:?}");
    }
    let p = ok(b"GET /a?q HTTP/1.2\r\nHost: h\r\nX-Y: z\r\n\r\n");
    assert_eq!((p.path.as_str(), p.query.as_str()), ("/a", "q"));
    assert_eq!(p.headers[1], ("x-y".to_owned(), "z".to_owned()));
    let p = ok(b"POST / HTTP/1.2\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n");
    assert_eq!(p.body, Chunked);
    // The line is still incomplete until its end arrives.
    for input in [&b"GET / HTTP/1.2"[..], b"GET / HTTP/1.2\r\nHost: h\r\n"] {
        assert_eq!(parse3(input, &Limits::default()), Ok(None));
    }
}

#[test]
fn rejections_carry_their_status() {
    let cases = REJECTIONS;
    for &(name, input, status) in cases {
        match parse3(input, &Limits::default()) {
            Err(err) => assert_eq!(err.status, status, "{name}: {err:?}"),
            other => panic!("{name}: expected {status}, got {other:?}"),
        }
    }
}

#[test]
fn limits_apply_at_the_same_byte_however_the_input_is_split() {
    let small = Limits {
        max_head_bytes: 64,
        max_headers: 3,
        max_uri_bytes: 16,
    };
    let at_head_limit = b"GET / HTTP/1.1\r\nHost: h\r\nX: 01234567890123456789012345678901\r\n\r\n";
    assert_eq!(at_head_limit.len(), 64);
    let one_over = b"GET / HTTP/1.1\r\nHost: h\r\nX: 012345678901234567890123456789012\r\n\r\n";
    assert_eq!(one_over.len(), 65);
    let long_uri = format!("GET /{} HTTP/1.1\r\nHost: h\r\n\r\n", "a".repeat(16));
    let ok_uri = format!("GET /{} HTTP/1.1\r\nHost: h\r\n\r\n", "a".repeat(15));
    let cases: &[(&str, &[u8], Option<u16>)] = &[
        ("head at the limit", at_head_limit, None),
        (
            "head one byte over",
            one_over,
            Some(431),
        ),
        (
            "headers at the limit",
            b"GET / HTTP/1.1\r\nHost: h\r\nA: 1\r\nB: 2\r\n\r\n",
            None,
        ),
        (
            "one header too many",
            b"GET / HTTP/1.1\r\nHost: h\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n",
            Some(431),
        ),
        ("target at the limit", ok_uri.as_bytes(), None),
        ("target one byte over", long_uri.as_bytes(), Some(414)),
        // The target wins over a later error, however the bytes arrive.
        (
            "long target and bad version",
            b"GET /aaaaaaaaaaaaaaaaa HTTP/9.9\r\n\r\n",
            Some(414),
        ),
        // An error past the head limit is never reached: the limit is, at byte 65.
        (
            "bad byte after the head limit",
            b"GET / HTTP/1.1\r\nHost: h\r\nX: 0123456789012345678901234567890123456789012345678\x01\r\n\r\n",
            Some(431),
        ),
        // An error before a limit is reached wins over the limit.
        (
            "bad byte before the head limit",
            b"GET / HTTP/1.1\r\nHost: h\r\nX: 0\x01123456789012345678901234567890123456789012345678\r\n\r\n",
            Some(400),
        ),
    ];
    for &(name, input, status) in cases {
        match (parse3(input, &small), status) {
            (Ok(Some(_)), None) => {}
            (Err(err), Some(status)) => assert_eq!(err.status, status, "{name}: {err:?}"),
            (other, _) => panic!("{name}: expected {status:?}, got {other:?}"),
        }
    }
}

#[test]
fn incomplete_heads_wait_for_more() {
    let cases: &[&[u8]] = &[
        b"",
        b"\r\n",
        b"G",
        b"GET / HTTP/1.",
        b"GET / HTTP/1.1\r\nHost: h\r\n",
        b"GET / HTTP/1.1\r\nHost: a\r\n",
        b"GET / HTTP/1.1\r\nHost: a\r\n\r",
    ];
    for &input in cases {
        assert_eq!(
            parse3(input, &Limits::default()),
            Ok(None),
            "{:?}",
            String::from_utf8_lossy(input)
        );
    }
}

#[test]
fn endless_heads_are_cut_at_the_limit() {
    let small = Limits {
        max_head_bytes: 90,
        max_headers: 100,
        max_uri_bytes: 16,
    };
    let cases: &[(&str, Vec<u8>, u16, usize)] = &[
        // (name, bytes that never finish a head, status, the prefix length that gets it)
        (
            "endless field",
            [&b"GET / HTTP/1.1\r\nHost: h\r\nX: "[..], &[b'a'; 100]].concat(),
            431,
            91,
        ),
        ("endless blank lines", b"\r\n".repeat(50), 431, 91),
        (
            "endless target",
            [&b"GET /"[..], &[b'a'; 100]].concat(),
            414,
            16 + 64 + 1,
        ),
        (
            "endless target after blank lines",
            [&b"\r\n\r\nGET /"[..], &[b'a'; 100]].concat(),
            414,
            4 + 16 + 64 + 1,
        ),
        (
            "target then endless version",
            [&b"GET /aaaaaaaaaaaaaaaaa HTTP/1.1"[..], &[b' '; 30]].concat(),
            414,
            23,
        ),
    ];
    for (name, input, status, at) in cases {
        assert_eq!(
            parse3(input, &small).map_err(|e| e.status),
            Err(*status),
            "{name}"
        );
        let mut head = Head::default();
        let mut before = input[..at - 1].to_vec();
        assert_eq!(
            parse_head(&mut before, &small, &mut head),
            Ok(false),
            "{name}: too early"
        );
        let mut cut = input[..*at].to_vec();
        assert_eq!(
            parse_head(&mut cut, &small, &mut head).map_err(|e| e.status),
            Err(*status),
            "{name}"
        );
    }
}

#[test]
fn host_is_optional_in_http10_and_may_be_empty() {
    assert_eq!(ok(b"GET / HTTP/1.0\r\n\r\n").headers, vec![]);
    let p = ok(b"GET / HTTP/1.1\r\nHost:\r\n\r\n");
    assert_eq!(p.headers, vec![("host".to_owned(), String::new())]);
}

#[test]
fn many_header_slots_use_the_heap_path() {
    let limits = Limits {
        max_headers: 300,
        ..Limits::default()
    };
    let mut input = b"GET / HTTP/1.1\r\nHost: h\r\n".to_vec();
    for i in 0..299 {
        input.extend_from_slice(format!("X-{i}: {i}\r\n").as_bytes());
    }
    input.extend_from_slice(b"\r\n");
    let p = parse3(&input, &limits).unwrap().unwrap();
    assert_eq!(p.headers.len(), 300);
    assert_eq!(p.headers[299], ("x-298".to_owned(), "298".to_owned()));
    let too_many = [&input[..input.len() - 2], b"Y: 1\r\n\r\n"].concat();
    assert_eq!(parse3(&too_many, &limits).map_err(|e| e.status), Err(431));
}

#[test]
fn error_messages_name_the_option() {
    let small = Limits {
        max_head_bytes: 8,
        ..Limits::default()
    };
    let err = parse_head(
        &mut b"GET / HTTP/1.1\r\nHost: h\r\n".to_vec(),
        &small,
        &mut Head::default(),
    );
    assert!(err.unwrap_err().reason.contains("--limit-header-size"));
}
