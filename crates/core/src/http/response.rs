//! Response heads and the chunked encoding of response bodies.
//!
//! Invariants:
//! * [`encode_head`] validates everything before writing anything: on `Err` the output buffer is
//!   exactly as it was, so the caller can fall back to a 500 on the same buffer.
//! * The application's header fields are written as given (same case, same order); the codec only
//!   adds what the framing needs (`content-length`, `transfer-encoding`, `connection`) and the
//!   server's own fields ([`ServerFields`]: `date`, `server` and the configured extra ones) that
//!   the application did not set. The one field it drops is `transfer-encoding` in a response to
//!   HTTP/1.0, which RFC 9112 §6.1 forbids.
//! * An extra field of [`ServerFields`] with the name `date` or `server` replaces the built-in
//!   one; every extra field passed [`valid_field`] when it was configured.
//! * The returned [`Framing`] is the contract for the body: `send_body == false` means every body
//!   byte is dropped; `chunked` means every body write goes through [`encode_chunk`] and the
//!   response ends with [`encode_last_chunk`]; `keep_alive == false` means close after the body.

use std::fmt;

use super::request::{list_items, parse_decimal, trim_ows};
use super::Version;

/// What the response encoder needs to know about the request it answers.
#[derive(Debug, Clone, Copy)]
pub struct RequestInfo {
    pub version: Version,
    pub is_head: bool,
    /// The request allows another request after it ([`Head::keep_alive`](super::Head)).
    pub keep_alive: bool,
}

/// How the response body must be written, decided by [`encode_head`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Framing {
    /// The caller must chunk-encode body writes and finish with the last chunk.
    pub chunked: bool,
    /// False for HEAD requests and 1xx, 204 and 304 responses: the caller drops body bytes.
    pub send_body: bool,
    /// The connection may serve another request after this response.
    pub keep_alive: bool,
    /// The declared length (the application's `content-length`, or the one added from
    /// `known_length`), which the caller may check the body against.
    pub content_length: Option<u64>,
}

/// The fields the server adds to every response head, unless the application set a field of the
/// same name: `date`, `server`, then the configured extra fields (`--header`), in that order.
#[derive(Debug, Clone, Copy, Default)]
pub struct ServerFields<'a> {
    /// The `date` value, when the server sends one.
    pub date: Option<&'a [u8]>,
    /// The `server` value, when the server sends one.
    pub server: Option<&'a [u8]>,
    /// Extra `(name, value)` fields, each checked with [`valid_field`] when configured. One
    /// named `date` or `server` replaces the built-in field.
    pub extra: &'a [(Vec<u8>, Vec<u8>)],
}

impl ServerFields<'_> {
    /// Writes the fields: `date` and `server` unless the application set them
    /// (`app_date`, `app_server`) or an extra field replaces them, then each extra field whose
    /// name `app_has` says the application did not set. Values are written as they are: the
    /// callers check `date` and `server`, and extra fields were checked when configured.
    fn push(
        &self,
        out: &mut Vec<u8>,
        app_date: bool,
        app_server: bool,
        app_has: impl Fn(&[u8]) -> bool,
    ) {
        let replaced = |name: &[u8]| {
            !self.extra.is_empty() && self.extra.iter().any(|(n, _)| n.eq_ignore_ascii_case(name))
        };
        if let (Some(date), false) = (self.date, app_date) {
            if !replaced(b"date") {
                push_field(out, b"date", date);
            }
        }
        if let (Some(server), false) = (self.server, app_server) {
            if !replaced(b"server") {
                push_field(out, b"server", server);
            }
        }
        for (name, value) in self.extra {
            if !app_has(name) {
                push_field(out, name, value);
            }
        }
    }
}

/// Whether `name: value` can be written as a header field: the name an RFC 9110 token, the value
/// without CR, LF or NUL.
pub fn valid_field(name: &[u8], value: &[u8]) -> bool {
    !name.is_empty() && name.iter().copied().all(is_tchar) && valid_value(value)
}

/// A response head the codec refuses to write; the message names the bad header or status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderError(pub String);

impl fmt::Display for HeaderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for HeaderError {}

/// What the application's header fields say about framing.
#[derive(Debug, Default)]
#[allow(
    clippy::struct_excessive_bools,
    reason = "independent facts, not a state"
)]
struct AppFields {
    content_length: Option<u64>,
    transfer_encoding: bool,
    chunked: bool,
    close: bool,
    keep_alive: bool,
    date: bool,
    server: bool,
}

/// Checks the application's part of a response head, as [`encode_head`] will: the status a
/// three-digit code, every name a token, every value free of CR, LF and NUL, `content-length` a
/// number (the same in every field), and not both `content-length` and `transfer-encoding`.
/// The server calls it when the application starts its response, so that a head it could never
/// write is the application's error while a `500` can still be sent.
pub fn check_response<'a>(
    status: u16,
    headers: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
) -> Result<(), HeaderError> {
    check_app_head(status, headers).map(|_| ())
}

/// [`check_response`], returning what the fields say about framing.
fn check_app_head<'a>(
    status: u16,
    headers: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
) -> Result<AppFields, HeaderError> {
    if !(100..=999).contains(&status) {
        return Err(HeaderError(format!(
            "status {status} is not a three-digit code (100..=999)"
        )));
    }
    let app = scan_fields(headers)?;
    if app.content_length.is_some() && app.transfer_encoding {
        return Err(HeaderError(
            "both content-length and transfer-encoding set (RFC 9112 §6.2 forbids it)".to_owned(),
        ));
    }
    Ok(app)
}

/// Appends the status line, the header fields and the blank line to `out`, and decides the body
/// framing. On `Err`, `out` is unchanged.
pub fn encode_head(
    out: &mut Vec<u8>,
    req: RequestInfo,
    status: u16,
    headers: &[(&[u8], &[u8])],
    known_length: Option<u64>,
    fields: &ServerFields<'_>,
) -> Result<Framing, HeaderError> {
    let app = check_app_head(status, headers.iter().copied())?;
    for (name, value) in [(&b"date"[..], fields.date), (b"server", fields.server)] {
        if value.is_some_and(|v| !valid_value(v)) {
            return Err(HeaderError(format!(
                "{} value contains CR, LF or NUL",
                ascii(name)
            )));
        }
    }

    let http10 = req.version == Version::Http10;
    let no_body_status = status < 200 || status == 204 || status == 304;
    let send_body = !req.is_head && !no_body_status;
    // What the codec adds, and whether the end of the body is known without closing.
    let mut add_length = None;
    let mut add_chunked = false;
    let mut chunked = false;
    let delimited = if !send_body || app.content_length.is_some() {
        true
    } else if app.transfer_encoding {
        // An HTTP/1.0 client cannot read chunks, and the field is dropped: body until close.
        // A coding other than chunked without chunked is the application's own: until close.
        chunked = !http10 && app.chunked;
        chunked
    } else if let Some(n) = known_length {
        add_length = Some(n);
        true
    } else if !http10 {
        add_chunked = true;
        chunked = true;
        true
    } else {
        false
    };
    let keep_alive = req.keep_alive && !app.close && delimited;

    out.extend_from_slice(b"HTTP/1.1 ");
    push_decimal(out, u64::from(status));
    out.push(b' ');
    out.extend_from_slice(reason_phrase(status));
    out.extend_from_slice(b"\r\n");
    fields.push(out, app.date, app.server, |name| {
        headers.iter().any(|(n, _)| n.eq_ignore_ascii_case(name))
    });
    for &(name, value) in headers {
        if http10 && name.eq_ignore_ascii_case(b"transfer-encoding") {
            continue;
        }
        push_field(out, name, value);
    }
    if let Some(n) = add_length {
        out.extend_from_slice(b"content-length: ");
        push_decimal(out, n);
        out.extend_from_slice(b"\r\n");
    }
    if add_chunked {
        out.extend_from_slice(b"transfer-encoding: chunked\r\n");
    }
    if !keep_alive && !app.close {
        out.extend_from_slice(b"connection: close\r\n");
    } else if keep_alive && http10 && !app.keep_alive {
        out.extend_from_slice(b"connection: keep-alive\r\n");
    }
    out.extend_from_slice(b"\r\n");

    Ok(Framing {
        chunked: chunked && send_body,
        send_body,
        keep_alive,
        content_length: app.content_length.or(add_length),
    })
}

/// Validates the application's fields and collects what matters for framing.
/// Appends a `101 Switching Protocols` head that accepts a WebSocket upgrade (RFC 6455 §4.2.2):
/// `upgrade`, `connection` and `sec-websocket-accept` (`accept`, computed by the caller), the
/// chosen `subprotocol` if any, the negotiated `extensions` (a `sec-websocket-extensions`
/// value, written by the server) if any, the server's fields, then the application's `headers` (checked
/// as in [`encode_head`]; ones that would contradict the upgrade, such as `content-length`,
/// `transfer-encoding`, `connection`, `upgrade` or `sec-websocket-accept`, are refused). On
/// `Err`, `out` is unchanged.
pub fn encode_upgrade_head(
    out: &mut Vec<u8>,
    accept: &[u8],
    subprotocol: Option<&[u8]>,
    extensions: Option<&[u8]>,
    headers: &[(&[u8], &[u8])],
    fields: &ServerFields<'_>,
) -> Result<(), HeaderError> {
    const RESERVED: [&[u8]; 6] = [
        b"content-length",
        b"transfer-encoding",
        b"connection",
        b"upgrade",
        b"sec-websocket-accept",
        b"sec-websocket-extensions",
    ];
    let app = scan_fields(headers.iter().copied())?;
    if let Some((name, _)) = headers
        .iter()
        .find(|(n, _)| RESERVED.iter().any(|r| r.eq_ignore_ascii_case(n)))
    {
        return Err(HeaderError(format!(
            "header {:?} cannot be set on a WebSocket accept (the server writes the upgrade's \
             own fields)",
            ascii(name)
        )));
    }
    if let Some(p) = subprotocol {
        if p.is_empty() || !p.iter().copied().all(is_tchar) {
            return Err(HeaderError(format!(
                "subprotocol {:?} is not an RFC 9110 token",
                ascii(p)
            )));
        }
    }
    for (name, value) in [(&b"date"[..], fields.date), (b"server", fields.server)] {
        if value.is_some_and(|v| !valid_value(v)) {
            return Err(HeaderError(format!(
                "{} value contains CR, LF or NUL",
                ascii(name)
            )));
        }
    }
    out.extend_from_slice(
        b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\n",
    );
    push_field(out, b"sec-websocket-accept", accept);
    if let Some(p) = subprotocol {
        push_field(out, b"sec-websocket-protocol", p);
    }
    if let Some(e) = extensions {
        push_field(out, b"sec-websocket-extensions", e);
    }
    fields.push(out, app.date, app.server, |name| {
        headers.iter().any(|(n, _)| n.eq_ignore_ascii_case(name))
    });
    for &(name, value) in headers {
        push_field(out, name, value);
    }
    out.extend_from_slice(b"\r\n");
    Ok(())
}

fn scan_fields<'a>(
    headers: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
) -> Result<AppFields, HeaderError> {
    let mut app = AppFields::default();
    for (name, value) in headers {
        if name.is_empty() || !name.iter().copied().all(is_tchar) {
            return Err(HeaderError(format!(
                "header name {:?} is not an RFC 9110 token",
                ascii(name)
            )));
        }
        if !valid_value(value) {
            return Err(HeaderError(format!(
                "{} value contains CR, LF or NUL",
                ascii(name)
            )));
        }
        if name.eq_ignore_ascii_case(b"content-length") {
            let n = parse_decimal(trim_ows(value)).ok_or_else(|| {
                HeaderError(format!(
                    "content-length {:?} is not a decimal number",
                    ascii(value)
                ))
            })?;
            if app.content_length.is_some_and(|prev| prev != n) {
                return Err(HeaderError(
                    "several content-length values that differ".to_owned(),
                ));
            }
            app.content_length = Some(n);
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            app.transfer_encoding = true;
            app.chunked |= list_items(value).any(|c| c.eq_ignore_ascii_case(b"chunked"));
        } else if name.eq_ignore_ascii_case(b"connection") {
            for token in list_items(value) {
                app.close |= token.eq_ignore_ascii_case(b"close");
                app.keep_alive |= token.eq_ignore_ascii_case(b"keep-alive");
            }
        } else if name.eq_ignore_ascii_case(b"date") {
            app.date = true;
        } else if name.eq_ignore_ascii_case(b"server") {
            app.server = true;
        }
    }
    Ok(app)
}

/// tchar (RFC 9110 §5.6.2): one table load per byte of a field name, instead of a search of
/// the punctuation list (about 150 instructions per hello-world response).
pub(crate) fn is_tchar(b: u8) -> bool {
    TCHAR[usize::from(b)]
}

const TCHAR: [bool; 256] = {
    let mut table = [false; 256];
    let mut i = 0;
    while i < 256 {
        #[allow(clippy::cast_possible_truncation, reason = "i < 256")]
        let b = i as u8;
        table[i] = b.is_ascii_alphanumeric()
            || matches!(
                b,
                b'!' | b'#'
                    | b'$'
                    | b'%'
                    | b'&'
                    | b'\''
                    | b'*'
                    | b'+'
                    | b'-'
                    | b'.'
                    | b'^'
                    | b'_'
                    | b'`'
                    | b'|'
                    | b'~'
            );
        i += 1;
    }
    table
};

fn valid_value(value: &[u8]) -> bool {
    !value.iter().any(|&b| b == b'\r' || b == b'\n' || b == 0)
}

/// Bytes for an error message: lossy UTF-8, cut at 64 bytes.
fn ascii(bytes: &[u8]) -> String {
    String::from_utf8_lossy(&bytes[..bytes.len().min(64)]).into_owned()
}

fn push_field(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

fn push_decimal(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

/// Appends a chunk-size line: `{len:x}\r\n`.
pub fn write_chunk_size(out: &mut Vec<u8>, len: usize) {
    let mut digits = [0u8; 2 * size_of::<usize>()];
    let mut at = digits.len();
    let mut n = len;
    loop {
        at -= 1;
        digits[at] = b"0123456789abcdef"[n % 16];
        n /= 16;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
    out.extend_from_slice(b"\r\n");
}

/// Appends one chunk (size line, data, CRLF); nothing for empty data, which would end the body.
pub fn encode_chunk(out: &mut Vec<u8>, data: &[u8]) {
    if data.is_empty() {
        return;
    }
    write_chunk_size(out, data.len());
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// Appends the last chunk, the trailer fields and the final blank line. On `Err` (a trailer name
/// or value that [`encode_head`] would refuse too) `out` is unchanged.
pub fn encode_last_chunk(
    out: &mut Vec<u8>,
    trailers: &[(&[u8], &[u8])],
) -> Result<(), HeaderError> {
    for &(name, value) in trailers {
        if name.is_empty() || !name.iter().copied().all(is_tchar) {
            return Err(HeaderError(format!(
                "trailer name {:?} is not an RFC 9110 token",
                ascii(name)
            )));
        }
        if !valid_value(value) {
            return Err(HeaderError(format!(
                "trailer {} value contains CR, LF or NUL",
                ascii(name)
            )));
        }
    }
    out.extend_from_slice(b"0\r\n");
    for &(name, value) in trailers {
        push_field(out, name, value);
    }
    out.extend_from_slice(b"\r\n");
    Ok(())
}

/// The standard reason phrase of `status` (RFC 9110 §15 and the IANA registry); `b""` if none.
pub fn reason_phrase(status: u16) -> &'static [u8] {
    match status {
        100 => b"Continue",
        101 => b"Switching Protocols",
        102 => b"Processing",
        103 => b"Early Hints",
        200 => b"OK",
        201 => b"Created",
        202 => b"Accepted",
        203 => b"Non-Authoritative Information",
        204 => b"No Content",
        205 => b"Reset Content",
        206 => b"Partial Content",
        207 => b"Multi-Status",
        208 => b"Already Reported",
        226 => b"IM Used",
        300 => b"Multiple Choices",
        301 => b"Moved Permanently",
        302 => b"Found",
        303 => b"See Other",
        304 => b"Not Modified",
        305 => b"Use Proxy",
        307 => b"Temporary Redirect",
        308 => b"Permanent Redirect",
        400 => b"Bad Request",
        401 => b"Unauthorized",
        402 => b"Payment Required",
        403 => b"Forbidden",
        404 => b"Not Found",
        405 => b"Method Not Allowed",
        406 => b"Not Acceptable",
        407 => b"Proxy Authentication Required",
        408 => b"Request Timeout",
        409 => b"Conflict",
        410 => b"Gone",
        411 => b"Length Required",
        412 => b"Precondition Failed",
        413 => b"Content Too Large",
        414 => b"URI Too Long",
        415 => b"Unsupported Media Type",
        416 => b"Range Not Satisfiable",
        417 => b"Expectation Failed",
        418 => b"I'm a Teapot",
        421 => b"Misdirected Request",
        422 => b"Unprocessable Content",
        423 => b"Locked",
        424 => b"Failed Dependency",
        425 => b"Too Early",
        426 => b"Upgrade Required",
        428 => b"Precondition Required",
        429 => b"Too Many Requests",
        431 => b"Request Header Fields Too Large",
        451 => b"Unavailable For Legal Reasons",
        500 => b"Internal Server Error",
        501 => b"Not Implemented",
        502 => b"Bad Gateway",
        503 => b"Service Unavailable",
        504 => b"Gateway Timeout",
        505 => b"HTTP Version Not Supported",
        506 => b"Variant Also Negotiates",
        507 => b"Insufficient Storage",
        508 => b"Loop Detected",
        510 => b"Not Extended",
        511 => b"Network Authentication Required",
        _ => b"",
    }
}

/// A complete HTTP/1.1 response for a rejected request: `message` as a text/plain body, with
/// `content-length` and `connection: close`, then the server's fields. A status outside
/// 100..=999 is sent as 500. The answer to a `HEAD` request (`is_head`) has the same header
/// fields and no body (RFC 9110 §9.3.2): a client reads none, and would take the message for the
/// start of the next response.
pub fn error_response(
    status: u16,
    message: &str,
    fields: &ServerFields<'_>,
    is_head: bool,
) -> Vec<u8> {
    let status = if (100..=999).contains(&status) {
        status
    } else {
        500
    };
    let mut out = Vec::with_capacity(160 + message.len());
    out.extend_from_slice(b"HTTP/1.1 ");
    push_decimal(&mut out, u64::from(status));
    out.push(b' ');
    out.extend_from_slice(reason_phrase(status));
    out.extend_from_slice(b"\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: ");
    push_decimal(&mut out, message.len() as u64);
    out.extend_from_slice(b"\r\nconnection: close\r\n");
    let checked = ServerFields {
        date: fields.date.filter(|d| valid_value(d)),
        server: fields.server.filter(|s| valid_value(s)),
        extra: fields.extra,
    };
    // The fields this response sets itself stand for the application's.
    checked.push(&mut out, false, false, |name| {
        [&b"content-type"[..], b"content-length", b"connection"]
            .iter()
            .any(|n| n.eq_ignore_ascii_case(name))
    });
    out.extend_from_slice(b"\r\n");
    if !is_head {
        out.extend_from_slice(message.as_bytes());
    }
    out
}

#[cfg(test)]
mod tests;
