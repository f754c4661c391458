use super::*;
use crate::http::{BodyDecoder, BodyKind, Limits};

const V11: RequestInfo = RequestInfo {
    version: Version::Http11,
    is_head: false,
    keep_alive: true,
};
const V11_CLOSE: RequestInfo = RequestInfo {
    keep_alive: false,
    ..V11
};
const HEAD11: RequestInfo = RequestInfo {
    is_head: true,
    ..V11
};
const V10: RequestInfo = RequestInfo {
    version: Version::Http10,
    is_head: false,
    keep_alive: false,
};
const V10_KA: RequestInfo = RequestInfo {
    keep_alive: true,
    ..V10
};

const fn framing(
    chunked: bool,
    send_body: bool,
    keep_alive: bool,
    content_length: Option<u64>,
) -> Framing {
    Framing {
        chunked,
        send_body,
        keep_alive,
        content_length,
    }
}

/// (name, request, status, app fields, known length, expected head, expected framing)
type HeadCase = (
    &'static str,
    RequestInfo,
    u16,
    &'static [(&'static [u8], &'static [u8])],
    Option<u64>,
    &'static str,
    Framing,
);

const HEAD_CASES: &[HeadCase] = &[
    (
        "known length",
        V11,
        200,
        &[],
        Some(5),
        "HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n",
        framing(false, true, true, Some(5)),
    ),
    (
        "unknown length is chunked",
        V11,
        200,
        &[],
        None,
        "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
        framing(true, true, true, None),
    ),
    (
        "app content-length, written as given",
        V11,
        200,
        &[(b"Content-Length", b"3")],
        None,
        "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n",
        framing(false, true, true, Some(3)),
    ),
    (
        "app content-length wins over known",
        V11,
        200,
        &[(b"content-length", b" 3 ")],
        Some(9),
        "HTTP/1.1 200 OK\r\ncontent-length:  3 \r\n\r\n",
        framing(false, true, true, Some(3)),
    ),
    (
        "app chunked",
        V11,
        200,
        &[(b"Transfer-Encoding", b"chunked")],
        Some(5),
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
        framing(true, true, true, None),
    ),
    (
        "app coding without chunked: until close",
        V11,
        200,
        &[(b"transfer-encoding", b"gzip")],
        None,
        "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\nconnection: close\r\n\r\n",
        framing(false, true, false, None),
    ),
    (
        "app header case and order kept",
        V11,
        200,
        &[(b"X-B", b"2"), (b"x-a", b"1")],
        Some(0),
        "HTTP/1.1 200 OK\r\nX-B: 2\r\nx-a: 1\r\ncontent-length: 0\r\n\r\n",
        framing(false, true, true, Some(0)),
    ),
    (
        "request asked to close",
        V11_CLOSE,
        200,
        &[],
        Some(1),
        "HTTP/1.1 200 OK\r\ncontent-length: 1\r\nconnection: close\r\n\r\n",
        framing(false, true, false, Some(1)),
    ),
    (
        "app closes",
        V11,
        200,
        &[(b"Connection", b"Close")],
        Some(1),
        "HTTP/1.1 200 OK\r\nConnection: Close\r\ncontent-length: 1\r\n\r\n",
        framing(false, true, false, Some(1)),
    ),
    (
        "app closes in a list",
        V11,
        200,
        &[(b"connection", b"x, close")],
        None,
        "HTTP/1.1 200 OK\r\nconnection: x, close\r\ntransfer-encoding: chunked\r\n\r\n",
        framing(true, true, false, None),
    ),
    (
        "1.0 unknown length: until close",
        V10,
        200,
        &[],
        None,
        "HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n",
        framing(false, true, false, None),
    ),
    (
        "1.0 keep-alive, unknown length: until close",
        V10_KA,
        200,
        &[],
        None,
        "HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n",
        framing(false, true, false, None),
    ),
    (
        "1.0 keep-alive, known length",
        V10_KA,
        200,
        &[],
        Some(5),
        "HTTP/1.1 200 OK\r\ncontent-length: 5\r\nconnection: keep-alive\r\n\r\n",
        framing(false, true, true, Some(5)),
    ),
    (
        "1.0 keep-alive, app says keep-alive",
        V10_KA,
        200,
        &[(b"Connection", b"Keep-Alive")],
        Some(5),
        "HTTP/1.1 200 OK\r\nConnection: Keep-Alive\r\ncontent-length: 5\r\n\r\n",
        framing(false, true, true, Some(5)),
    ),
    (
        "1.0 without keep-alive, known length",
        V10,
        200,
        &[],
        Some(5),
        "HTTP/1.1 200 OK\r\ncontent-length: 5\r\nconnection: close\r\n\r\n",
        framing(false, true, false, Some(5)),
    ),
    (
        "1.0 app chunked is dropped: until close",
        V10_KA,
        200,
        &[(b"Transfer-Encoding", b"chunked"), (b"X", b"y")],
        None,
        "HTTP/1.1 200 OK\r\nX: y\r\nconnection: close\r\n\r\n",
        framing(false, true, false, None),
    ),
    (
        "HEAD known length adds nothing",
        HEAD11,
        200,
        &[],
        Some(5),
        "HTTP/1.1 200 OK\r\n\r\n",
        framing(false, false, true, None),
    ),
    (
        "HEAD unknown length adds nothing",
        HEAD11,
        200,
        &[],
        None,
        "HTTP/1.1 200 OK\r\n\r\n",
        framing(false, false, true, None),
    ),
    (
        "HEAD app content-length",
        HEAD11,
        200,
        &[(b"content-length", b"10")],
        None,
        "HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n",
        framing(false, false, true, Some(10)),
    ),
    (
        "HEAD app chunked is not chunked",
        HEAD11,
        200,
        &[(b"transfer-encoding", b"chunked")],
        None,
        "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
        framing(false, false, true, None),
    ),
    (
        "HEAD 1.0 keeps alive",
        RequestInfo {
            is_head: true,
            ..V10_KA
        },
        200,
        &[],
        None,
        "HTTP/1.1 200 OK\r\nconnection: keep-alive\r\n\r\n",
        framing(false, false, true, None),
    ),
    (
        "204",
        V11,
        204,
        &[],
        Some(5),
        "HTTP/1.1 204 No Content\r\n\r\n",
        framing(false, false, true, None),
    ),
    (
        "304 with app length",
        V11,
        304,
        &[(b"content-length", b"7")],
        None,
        "HTTP/1.1 304 Not Modified\r\ncontent-length: 7\r\n\r\n",
        framing(false, false, true, Some(7)),
    ),
    (
        "304 unknown length",
        V11,
        304,
        &[],
        None,
        "HTTP/1.1 304 Not Modified\r\n\r\n",
        framing(false, false, true, None),
    ),
    (
        "100",
        V11,
        100,
        &[],
        None,
        "HTTP/1.1 100 Continue\r\n\r\n",
        framing(false, false, true, None),
    ),
    (
        "101 upgrade",
        V11,
        101,
        &[(b"Connection", b"Upgrade"), (b"Upgrade", b"websocket")],
        None,
        "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
        framing(false, false, true, None),
    ),
    (
        "unknown status",
        V11,
        299,
        &[],
        Some(0),
        "HTTP/1.1 299 \r\ncontent-length: 0\r\n\r\n",
        framing(false, true, true, Some(0)),
    ),
    (
        "empty value",
        V11,
        200,
        &[(b"X", b"")],
        Some(0),
        "HTTP/1.1 200 OK\r\nX: \r\ncontent-length: 0\r\n\r\n",
        framing(false, true, true, Some(0)),
    ),
    (
        "obs-text value",
        V11,
        200,
        &[(b"X", b"caf\xc3\xa9\t!")],
        Some(0),
        "HTTP/1.1 200 OK\r\nX: caf\u{e9}\t!\r\ncontent-length: 0\r\n\r\n",
        framing(false, true, true, Some(0)),
    ),
];

#[test]
fn heads_and_framing() {
    let cases = HEAD_CASES;
    for &(name, req, status, headers, known, want, want_framing) in cases {
        let mut out = Vec::new();
        let got = encode_head(
            &mut out,
            req,
            status,
            headers,
            known,
            &ServerFields::default(),
        );
        assert_eq!(got, Ok(want_framing), "{name}");
        assert_eq!(String::from_utf8_lossy(&out), want, "{name}");
    }
}

#[test]
fn date_and_server_are_added_unless_the_app_set_them() {
    let date = b"Sun, 06 Nov 1994 08:49:37 GMT";
    let mut out = Vec::new();
    encode_head(
        &mut out,
        V11,
        200,
        &[],
        Some(0),
        &ServerFields {
            date: Some(date),
            server: Some(b"ferroloop"),
            extra: &[],
        },
    )
    .unwrap();
    let want = "HTTP/1.1 200 OK\r\ndate: Sun, 06 Nov 1994 08:49:37 GMT\r\nserver: ferroloop\r\ncontent-length: 0\r\n\r\n";
    assert_eq!(String::from_utf8_lossy(&out), want);

    let mut out = Vec::new();
    let app: &[(&[u8], &[u8])] = &[(b"Date", b"yesterday"), (b"SERVER", b"mine")];
    encode_head(
        &mut out,
        V11,
        200,
        app,
        Some(0),
        &ServerFields {
            date: Some(date),
            server: Some(b"ferroloop"),
            extra: &[],
        },
    )
    .unwrap();
    let want = "HTTP/1.1 200 OK\r\nDate: yesterday\r\nSERVER: mine\r\ncontent-length: 0\r\n\r\n";
    assert_eq!(String::from_utf8_lossy(&out), want);
}

#[test]
fn bad_heads_are_refused_and_leave_the_buffer_alone() {
    type Case<'a> = (u16, &'a [(&'a [u8], &'a [u8])], Option<&'a [u8]>, &'a str);
    let cases: &[Case<'_>] = &[
        (99, &[], None, "status 99"),
        (1000, &[], None, "status 1000"),
        (0, &[], None, "status 0"),
        (200, &[(b"Bad Name", b"x")], None, "Bad Name"),
        (200, &[(b"", b"x")], None, "\"\""),
        (200, &[(b"X:Y", b"x")], None, "X:Y"),
        (200, &[(b"caf\xc3\xa9", b"x")], None, "caf"),
        (
            200,
            &[(b"X-Ok", b"1"), (b"X-Split", b"a\r\nInjected: 1")],
            None,
            "X-Split",
        ),
        (200, &[(b"X-Lf", b"a\nb")], None, "X-Lf"),
        (200, &[(b"X-Nul", b"a\0b")], None, "X-Nul"),
        (200, &[(b"Content-Length", b"abc")], None, "content-length"),
        (200, &[(b"Content-Length", b"-1")], None, "content-length"),
        (200, &[(b"Content-Length", b"")], None, "content-length"),
        (
            200,
            &[(b"Content-Length", b"1"), (b"content-length", b"2")],
            None,
            "content-length",
        ),
        (
            200,
            &[
                (b"Content-Length", b"1"),
                (b"Transfer-Encoding", b"chunked"),
            ],
            None,
            "transfer-encoding",
        ),
        (200, &[], Some(b"ferroloop\r\nX: 1"), "server"),
    ];
    for &(status, headers, server, names) in cases {
        let mut out = b"earlier response".to_vec();
        let fields = ServerFields {
            server,
            ..ServerFields::default()
        };
        let err = encode_head(&mut out, V11, status, headers, None, &fields).unwrap_err();
        assert!(err.to_string().contains(names), "{err} should name {names}");
        assert_eq!(out, b"earlier response", "{err}");
        // What the app controls is refused already at `http.response.start`, with the same
        // error; the server's own fields are not the app's to check.
        let early = check_response(status, headers.iter().copied());
        if server.is_none() {
            assert_eq!(early, Err(err), "{names}");
        } else {
            assert_eq!(early, Ok(()), "{names}");
        }
    }
}

#[test]
fn heads_the_encoder_writes_pass_the_early_check() {
    type Case<'a> = (u16, &'a [(&'a [u8], &'a [u8])]);
    let cases: &[Case<'_>] = &[
        (200, &[]),
        (100, &[]),
        (999, &[(b"X-Empty", b"")]),
        (
            200,
            &[(b"Content-Length", b"5"), (b"content-length", b" 5 ")],
        ),
        (200, &[(b"Transfer-Encoding", b"gzip, chunked")]),
        (200, &[(b"X-Text", b"caf\xe9 \t\x7f \x01 \xff")]),
        (204, &[(b"!#$%&'*+-.^_`|~", b"v")]),
    ];
    for &(status, headers) in cases {
        assert_eq!(check_response(status, headers.iter().copied()), Ok(()));
        let mut out = Vec::new();
        let fields = ServerFields::default();
        assert!(encode_head(&mut out, V11, status, headers, None, &fields).is_ok());
    }
}

#[test]
fn chunk_framing() {
    let sizes: &[(usize, &str)] = &[
        (0, "0\r\n"),
        (1, "1\r\n"),
        (15, "f\r\n"),
        (255, "ff\r\n"),
        (4096, "1000\r\n"),
        (usize::MAX, "ffffffffffffffff\r\n"),
    ];
    for &(len, want) in sizes {
        let mut out = Vec::new();
        write_chunk_size(&mut out, len);
        assert_eq!(String::from_utf8_lossy(&out), want);
    }
    let mut out = Vec::new();
    encode_chunk(&mut out, b"");
    assert!(out.is_empty(), "an empty chunk would end the body");
    encode_chunk(&mut out, b"hello");
    encode_chunk(&mut out, &[b'x'; 20]);
    encode_last_chunk(&mut out, &[]).unwrap();
    assert_eq!(
        out,
        [&b"5\r\nhello\r\n14\r\n"[..], &[b'x'; 20], b"\r\n0\r\n\r\n"].concat()
    );

    let mut out = Vec::new();
    encode_last_chunk(&mut out, &[(b"X-Sum", b"1"), (b"Y", b"2")]).unwrap();
    assert_eq!(out, b"0\r\nX-Sum: 1\r\nY: 2\r\n\r\n");
    let err = encode_last_chunk(&mut out, &[(b"Bad Name", b"1")]).unwrap_err();
    assert!(err.0.contains("Bad Name"));
    let err = encode_last_chunk(&mut out, &[(b"X-Bad", b"\r\n")]).unwrap_err();
    assert!(err.0.contains("X-Bad"));
    assert_eq!(out, b"0\r\nX-Sum: 1\r\nY: 2\r\n\r\n");
}

#[test]
fn encoded_chunks_decode_back() {
    let pieces: &[&[u8]] = &[b"a", b"", b"\r\n", &[0xff; 300], b"0\r\n\r\n"];
    let mut wire = Vec::new();
    for piece in pieces {
        encode_chunk(&mut wire, piece);
    }
    encode_last_chunk(&mut wire, &[(b"T", b"v")]).unwrap();
    wire.extend_from_slice(b"NEXT");
    let mut decoder = BodyDecoder::new(BodyKind::Chunked, &Limits::default());
    let (mut at, mut body) = (0, Vec::new());
    while !decoder.is_done() {
        let d = decoder.decode(&wire[at..]).unwrap();
        body.extend_from_slice(&wire[at..][d.data]);
        at += d.consumed;
    }
    assert_eq!(body, pieces.concat());
    assert_eq!(&wire[at..], b"NEXT");
}

#[test]
fn reason_phrases() {
    assert_eq!(reason_phrase(200), b"OK");
    assert_eq!(reason_phrase(404), b"Not Found");
    assert_eq!(reason_phrase(431), b"Request Header Fields Too Large");
    assert_eq!(reason_phrase(505), b"HTTP Version Not Supported");
    assert_eq!(reason_phrase(599), b"");
    assert_eq!(reason_phrase(0), b"");
}

#[test]
fn error_responses_are_complete_and_close() {
    let fields = ServerFields {
        date: Some(b"Thu, 01 Jan 1970 00:00:00 GMT"),
        ..ServerFields::default()
    };
    let got = error_response(431, "too big", &fields, false);
    let want = "HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: 7\r\nconnection: close\r\ndate: Thu, 01 Jan 1970 00:00:00 GMT\r\n\r\ntoo big";
    assert_eq!(String::from_utf8_lossy(&got), want);
    let got = error_response(400, "", &ServerFields::default(), false);
    let want = "HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
    assert_eq!(String::from_utf8_lossy(&got), want);
    assert!(error_response(7, "x", &ServerFields::default(), false)
        .starts_with(b"HTTP/1.1 500 Internal Server Error\r\n"));
}

#[test]
fn error_response_to_head_has_the_headers_and_no_body() {
    let got = error_response(400, "bad chunk size", &ServerFields::default(), true);
    let want = "HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: 14\r\nconnection: close\r\n\r\n";
    assert_eq!(String::from_utf8_lossy(&got), want);
}

#[test]
fn tchar_table_is_rfc_9110_token_characters() {
    // RFC 9110 §5.6.2: tchar = "!" / "#" / "$" / "%" / "&" / "'" / "*" / "+" / "-" / "." /
    // "^" / "_" / "`" / "|" / "~" / DIGIT / ALPHA
    let punctuation = b"!#$%&'*+-.^_`|~";
    for b in 0..=u8::MAX {
        let expected = b.is_ascii_digit() || b.is_ascii_alphabetic() || punctuation.contains(&b);
        assert_eq!(is_tchar(b), expected, "byte {b:#04x}");
    }
}

#[test]
fn extra_fields_follow_date_and_server_and_yield_to_the_app() {
    let extra = vec![
        (b"x-frame-options".to_vec(), b"DENY".to_vec()),
        (b"x-team".to_vec(), b"core".to_vec()),
    ];
    let fields = ServerFields {
        date: Some(b"Sun, 06 Nov 1994 08:49:37 GMT"),
        server: Some(b"ferroloop"),
        extra: &extra,
    };
    let mut out = Vec::new();
    let app: &[(&[u8], &[u8])] = &[(b"X-Team", b"app")];
    encode_head(&mut out, V11, 200, app, Some(0), &fields).unwrap();
    let want = "HTTP/1.1 200 OK\r\ndate: Sun, 06 Nov 1994 08:49:37 GMT\r\nserver: ferroloop\r\n\
                x-frame-options: DENY\r\nX-Team: app\r\ncontent-length: 0\r\n\r\n";
    assert_eq!(String::from_utf8_lossy(&out), want);
}

#[test]
fn an_extra_server_or_date_field_replaces_the_built_in_one() {
    let extra = vec![
        (b"Server".to_vec(), b"edge".to_vec()),
        (b"date".to_vec(), b"never".to_vec()),
    ];
    let fields = ServerFields {
        date: Some(b"Sun, 06 Nov 1994 08:49:37 GMT"),
        server: Some(b"ferroloop"),
        extra: &extra,
    };
    let mut out = Vec::new();
    encode_head(&mut out, V11, 204, &[], None, &fields).unwrap();
    let want = "HTTP/1.1 204 No Content\r\nServer: edge\r\ndate: never\r\n\r\n";
    assert_eq!(String::from_utf8_lossy(&out), want);
    // The application's own field still wins over the extra one.
    let mut out = Vec::new();
    let app: &[(&[u8], &[u8])] = &[(b"server", b"app")];
    encode_head(&mut out, V11, 204, app, None, &fields).unwrap();
    let want = "HTTP/1.1 204 No Content\r\ndate: never\r\nserver: app\r\n\r\n";
    assert_eq!(String::from_utf8_lossy(&out), want);
}

#[test]
fn error_responses_carry_the_server_fields_but_not_over_their_own() {
    let extra = vec![
        (b"x-team".to_vec(), b"core".to_vec()),
        (b"Content-Type".to_vec(), b"text/html".to_vec()),
    ];
    let fields = ServerFields {
        date: None,
        server: Some(b"ferroloop"),
        extra: &extra,
    };
    let got = error_response(400, "bad", &fields, false);
    let want = "HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain; charset=utf-8\r\n\
                content-length: 3\r\nconnection: close\r\nserver: ferroloop\r\nx-team: core\r\n\r\nbad";
    assert_eq!(String::from_utf8_lossy(&got), want);
}

#[test]
fn valid_field_wants_a_token_name_and_a_clean_value() {
    assert!(valid_field(b"x-frame-options", b"DENY"));
    assert!(valid_field(b"x", b""));
    assert!(!valid_field(b"", b"v"));
    assert!(!valid_field(b"bad name", b"v"));
    assert!(!valid_field(b"x:y", b"v"));
    assert!(!valid_field(b"x", b"a\r\nInjected: 1"));
    assert!(!valid_field(b"x", b"nul\0"));
}

#[test]
fn upgrade_head_carries_the_accept_key_the_subprotocol_and_the_fields() {
    let fields = ServerFields {
        date: Some(b"Fri, 27 Nov 2026 06:00:00 GMT"),
        server: Some(b"ferroloop"),
        extra: &[],
    };
    let mut out = Vec::new();
    let app: &[(&[u8], &[u8])] = &[(b"x-app", b"1")];
    encode_upgrade_head(
        &mut out,
        b"s3pPLMBiTxaQ9kYGzzhZRbK+xOo=",
        Some(b"chat"),
        Some(b"permessage-deflate"),
        app,
        &fields,
    )
    .unwrap();
    let want = "HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\n\
                sec-websocket-accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\
                sec-websocket-protocol: chat\r\nsec-websocket-extensions: permessage-deflate\r\n\
                date: Fri, 27 Nov 2026 06:00:00 GMT\r\n\
                server: ferroloop\r\nx-app: 1\r\n\r\n";
    assert_eq!(String::from_utf8_lossy(&out), want);
}

#[test]
fn upgrade_head_refuses_fields_that_contradict_the_upgrade_and_leaves_out_unchanged() {
    let fields = ServerFields {
        date: None,
        server: None,
        extra: &[],
    };
    for app in [
        &[(&b"Content-Length"[..], &b"0"[..])][..],
        &[(b"connection", b"close")],
        &[(b"upgrade", b"h2c")],
        &[(b"bad name", b"v")],
        &[(b"x", b"a\r\nb")],
    ] {
        let mut out = b"kept".to_vec();
        assert!(encode_upgrade_head(&mut out, b"k", None, None, app, &fields).is_err());
        assert_eq!(out, b"kept");
    }
    let mut out = Vec::new();
    assert!(encode_upgrade_head(&mut out, b"k", Some(b"a b"), None, &[], &fields).is_err());
    assert!(out.is_empty());
}
