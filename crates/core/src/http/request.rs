//! Request heads: the request line and header section, parsed with `httparse`, then framed.
//!
//! Invariants:
//! * [`parse_head`] is a pure function of the buffer it is given: calling it again on the same
//!   bytes plus more gives the same answer as calling it once on the longer buffer, up to the
//!   point where it first answers `Ok(true)` or `Err`. To keep that true, every limit is applied
//!   as "the earliest prefix at which the limit is exceeded" (see `earliest_limit`), never as a
//!   check on whatever the buffer happens to hold at the moment.
//! * Until it answers `Ok(true)` it does not modify `buf`; only then are header names lowercased
//!   in place. A `Head` it filled holds ranges into that `buf` and is only meaningful with it.
//! * The head is the first `head.head_len` bytes of `buf`; nothing after that is looked at beyond
//!   what the limits need, so a body or a pipelined request may follow.

use std::mem::MaybeUninit;
use std::ops::Range;

use super::{HttpError, Version};

/// Size limits of a request head. Each one, when exceeded, rejects the request with the status
/// named on the field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Request line plus header section, including the final blank line, in bytes: 431 above it.
    /// Default 65536: between h11's 16 KiB `max_incomplete_event_size` (too small for some cookie
    /// headers) and hyper's ~400 KiB read buffer limit.
    pub max_head_bytes: usize,
    /// Header fields per request: 431 above it. Default 100, as hyper's `DEFAULT_MAX_HEADERS`.
    pub max_headers: usize,
    /// Request-target length in bytes: 414 above it. Default 8192, the minimum RFC 9112 §3
    /// recommends supporting (uvicorn/httptools and nginx's default `large_client_header_buffers`).
    pub max_uri_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_head_bytes: 65536,
            max_headers: 100,
            max_uri_bytes: 8192,
        }
    }
}

/// How the request body is delimited (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BodyKind {
    /// No body: neither Content-Length nor Transfer-Encoding, or Content-Length: 0.
    #[default]
    Empty,
    /// Exactly this many bytes follow the head.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

/// A parsed request head, as ranges into the buffer it was parsed from.
///
/// Reusable across requests: [`parse_head`] clears and refills it (keeping the header vector's
/// allocation).
#[derive(Debug, Clone, Default)]
pub struct Head {
    pub method: Range<usize>,
    pub target: Range<usize>,
    /// The request-target before the first `?`.
    pub path: Range<usize>,
    /// The request-target after the first `?`; empty (`target.end..target.end`) if none.
    pub query: Range<usize>,
    pub version: Version,
    /// (name, value): names lowercased in place in the buffer; values without surrounding
    /// spaces and tabs.
    pub headers: Vec<(Range<usize>, Range<usize>)>,
    /// Bytes of the head, including the blank line that ends it.
    pub head_len: usize,
    pub body: BodyKind,
    /// The connection may carry another request after this one (RFC 9112 §9.3).
    pub keep_alive: bool,
    /// HTTP/1.1 with `Expect: 100-continue`: send `100 Continue` before reading the body.
    pub expect_continue: bool,
    /// The request has an `Upgrade` field (RFC 9110 §7.8): the server looks closer (a
    /// WebSocket handshake) only then, so other requests pay nothing for it.
    pub upgrade: bool,
}

impl Head {
    /// The header fields as byte slices of `buf` (the buffer this head was parsed from).
    pub fn header_fields<'a>(
        &'a self,
        buf: &'a [u8],
    ) -> impl Iterator<Item = (&'a [u8], &'a [u8])> + 'a {
        self.headers
            .iter()
            .map(move |(n, v)| (&buf[n.clone()], &buf[v.clone()]))
    }

    /// The value of the first header field named `name` (lowercase), if any.
    pub fn header<'a>(&'a self, buf: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
        self.header_fields(buf)
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v)
    }
}

const HEAD_TOO_LARGE: HttpError = HttpError::new(
    431,
    "request head larger than max_head_bytes (default 65536); raise --limit-header-size",
);
const TOO_MANY_HEADERS: HttpError = HttpError::new(
    431,
    "more header fields than max_headers (default 100); raise --limit-headers",
);
const URI_TOO_LONG: HttpError = HttpError::new(
    414,
    "request-target longer than max_uri_bytes (default 8192); raise --limit-uri",
);
const BAD_VERSION: HttpError = HttpError::new(
    505,
    "unsupported HTTP version; only HTTP/1.x is served (HTTP/1.2 and above as HTTP/1.1)",
);
const BAD_REQUEST_LINE: HttpError = HttpError::new(
    400,
    "malformed request line; expected `METHOD target HTTP/1.1`",
);
const BAD_METHOD: HttpError = HttpError::new(400, "invalid byte in the request method");
const BAD_TARGET: HttpError = HttpError::new(400, "invalid byte in the request-target");
const BAD_HEADER_NAME: HttpError = HttpError::new(
    400,
    "invalid header line (bad byte in a name, or a line folded with leading whitespace, \
     which RFC 9112 §5.2 forbids in requests)",
);
const BAD_HEADER_VALUE: HttpError = HttpError::new(400, "invalid byte in a header value");
const BAD_NEWLINE: HttpError = HttpError::new(400, "invalid line ending in the request head");
const BAD_CONTENT_LENGTH: HttpError = HttpError::new(
    400,
    "content-length is not a decimal number that fits in 64 bits",
);
const CONFLICTING_CONTENT_LENGTH: HttpError =
    HttpError::new(400, "several content-length values that differ");
const TE_AND_CL: HttpError = HttpError::new(
    400,
    "both transfer-encoding and content-length (RFC 9112 §6.3)",
);
const TE_IN_HTTP10: HttpError = HttpError::new(400, "transfer-encoding in an HTTP/1.0 request");
const TE_NOT_FINAL_CHUNKED: HttpError = HttpError::new(
    400,
    "transfer-encoding whose final coding is not chunked; the body length is unknown",
);
const MISSING_HOST: HttpError = HttpError::new(
    400,
    "HTTP/1.1 request without a host header (RFC 9112 §3.2)",
);
const SEVERAL_HOSTS: HttpError =
    HttpError::new(400, "more than one host header line (RFC 9112 §3.2)");
const TE_UNSUPPORTED: HttpError = HttpError::new(
    501,
    "unsupported transfer-encoding; only `chunked` alone is supported",
);

/// Request-line bytes allowed beyond `max_uri_bytes` before an unfinished line is cut with 414:
/// room for the method, two spaces, the version and CRLF.
const REQUEST_LINE_SLACK: usize = 64;

/// Header slots kept on the stack; a larger `max_headers` uses a heap vector per call.
const STACK_HEADER_SLOTS: usize = 128;

/// Parses the request head at the start of `buf`.
///
/// `Ok(true)`: a complete head is in `buf[..head.head_len]` and `head` describes it (header names
/// are now lowercase in `buf`). `Ok(false)`: incomplete, call again with more bytes. `Err`: reject
/// with `err.status` and close.
pub fn parse_head(buf: &mut [u8], limits: &Limits, head: &mut Head) -> Result<bool, HttpError> {
    let (view_len, limit_error) = earliest_limit(buf, limits);
    let Some(head_len) = scan(&buf[..view_len], limits, head)? else {
        return match limit_error {
            Some(err) => Err(err),
            None => Ok(false),
        };
    };
    if head_len > limits.max_head_bytes {
        return Err(HEAD_TOO_LARGE);
    }
    for (name, _) in &head.headers {
        buf[name.clone()].make_ascii_lowercase();
    }
    head.head_len = head_len;
    decide_framing(buf, head)?;
    Ok(true)
}

/// The prefix of `buf` to parse, and the error to return if that prefix is still incomplete.
///
/// A limit is exceeded at a fixed prefix length (`max_head_bytes + 1` bytes of head; a request
/// line still without its LF after `max_uri_bytes + 64` bytes). Parsing only up to the earliest
/// such prefix makes the answer independent of how much data arrived in one read: an error that
/// lies before the cut still wins, a head that completes before it still parses.
fn earliest_limit(buf: &[u8], limits: &Limits) -> (usize, Option<HttpError>) {
    let mut cut = buf.len();
    let mut error = None;
    let head_cut = limits.max_head_bytes.saturating_add(1);
    if head_cut <= cut {
        cut = head_cut;
        error = Some(HEAD_TOO_LARGE);
    }
    let line_start = skip_empty_lines(buf);
    let line_cut = line_start
        .saturating_add(limits.max_uri_bytes)
        .saturating_add(REQUEST_LINE_SLACK + 1);
    if line_cut <= cut && !buf[line_start..line_cut].contains(&b'\n') {
        cut = line_cut;
        error = Some(URI_TOO_LONG);
    }
    (cut, error)
}

/// Where the request line starts: after the empty lines httparse tolerates before it.
fn skip_empty_lines(buf: &[u8]) -> usize {
    let mut at = 0;
    loop {
        match buf.get(at..) {
            Some([b'\r', b'\n', ..]) => at += 2,
            Some([b'\n', ..]) => at += 1,
            _ => return at,
        }
    }
}

/// Runs httparse over `view` and fills the ranges of `head`. `Ok(None)`: incomplete.
///
/// A request line with a higher HTTP/1 minor version (`HTTP/1.2` to `HTTP/1.9`) is read as
/// HTTP/1.1: RFC 9112 §2.3 says a server answers such a request as the highest minor version it
/// supports. httparse knows only `HTTP/1.0` and `HTTP/1.1`, so when it refuses the version this
/// way, a copy with the minor digit set to `1` is parsed instead (the ranges are offsets, the same
/// in `view`). Only such requests pay for the copy; every other one is parsed once, as before.
fn scan(view: &[u8], limits: &Limits, head: &mut Head) -> Result<Option<usize>, HttpError> {
    match scan_once(view, limits, head) {
        Err(Refusal::HigherMinor(digit_at)) => {
            let mut copy = view.to_vec();
            copy[digit_at] = b'1';
            scan_once(&copy, limits, head).map_err(Refusal::into_error)
        }
        other => other.map_err(Refusal::into_error),
    }
}

/// Why `scan_once` refused a head.
enum Refusal {
    /// `HTTP/1.<2-9>`: the minor digit is at this offset of the view.
    HigherMinor(usize),
    Error(HttpError),
}

impl Refusal {
    fn into_error(self) -> HttpError {
        match self {
            // Only reached if the copy is refused the same way, which it cannot be.
            Self::HigherMinor(_) => BAD_VERSION,
            Self::Error(err) => err,
        }
    }
}

impl From<HttpError> for Refusal {
    fn from(err: HttpError) -> Self {
        Self::Error(err)
    }
}

/// One httparse run over `view` for [`scan`].
fn scan_once(view: &[u8], limits: &Limits, head: &mut Head) -> Result<Option<usize>, Refusal> {
    let mut on_stack =
        [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; STACK_HEADER_SLOTS];
    let mut on_heap = Vec::new();
    let slots = if limits.max_headers <= STACK_HEADER_SLOTS {
        &mut on_stack[..limits.max_headers]
    } else {
        on_heap.resize_with(limits.max_headers, MaybeUninit::uninit);
        &mut on_heap[..]
    };
    let mut req = httparse::Request::new(&mut []);
    let status =
        httparse::ParserConfig::default().parse_request_with_uninit_headers(&mut req, view, slots);
    // The target is known as soon as the space after it arrived, before any later error could be
    // seen; checking it first keeps the answer independent of how the bytes were split.
    if req
        .path
        .is_some_and(|path| path.len() > limits.max_uri_bytes)
    {
        return Err(URI_TOO_LONG.into());
    }
    let head_len = match status {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(err) => return Err(map_error(err, view, &req)),
    };
    let base = view.as_ptr() as usize;
    let range_of = |s: &[u8]| {
        let start = s.as_ptr() as usize - base;
        start..start + s.len()
    };
    let (Some(method), Some(target), Some(minor)) = (req.method, req.path, req.version) else {
        unreachable!("httparse fills the request line of a complete request");
    };
    head.method = range_of(method.as_bytes());
    head.target = range_of(target.as_bytes());
    let path_end = target
        .find('?')
        .map_or(head.target.end, |q| head.target.start + q);
    head.path = head.target.start..path_end;
    head.query = (path_end + 1).min(head.target.end)..head.target.end;
    head.version = if minor == 0 {
        Version::Http10
    } else {
        Version::Http11
    };
    head.headers.clear();
    for field in &*req.headers {
        let value = range_of(field.value);
        let trimmed = trim_ows(field.value);
        let start = value.start + (trimmed.as_ptr() as usize - field.value.as_ptr() as usize);
        head.headers.push((
            range_of(field.name.as_bytes()),
            start..start + trimmed.len(),
        ));
    }
    head.head_len = head_len;
    head.body = BodyKind::Empty;
    head.keep_alive = false;
    head.expect_continue = false;
    head.upgrade = false;
    Ok(Some(head_len))
}

fn map_error(err: httparse::Error, view: &[u8], req: &httparse::Request<'_, '_>) -> Refusal {
    let err = match err {
        httparse::Error::TooManyHeaders => TOO_MANY_HEADERS,
        httparse::Error::Version => {
            // httparse stops at the first byte that cannot continue `HTTP/1.0` or `HTTP/1.1`
            // (with all eight bytes of the version there). `HTTP/1.<2-9>` is served as HTTP/1.1
            // (see `scan`); another `HTTP/<digit>` is a version we do not serve (505); anything
            // else is not a version.
            let start = req.path.map_or(view.len(), |path| {
                path.as_ptr() as usize - view.as_ptr() as usize + path.len() + 1
            });
            let version = view.get(start..).unwrap_or_default();
            if let [b'H', b'T', b'T', b'P', b'/', b'1', b'.', b'2'..=b'9', ..] = version {
                return Refusal::HigherMinor(start + 7);
            }
            if version.starts_with(b"HTTP/") && version.get(5).is_some_and(u8::is_ascii_digit) {
                BAD_VERSION
            } else {
                BAD_REQUEST_LINE
            }
        }
        httparse::Error::Token if req.method.is_none() => BAD_METHOD,
        httparse::Error::Token => BAD_TARGET,
        httparse::Error::HeaderName => BAD_HEADER_NAME,
        httparse::Error::HeaderValue => BAD_HEADER_VALUE,
        httparse::Error::NewLine => BAD_NEWLINE,
        httparse::Error::Status => BAD_REQUEST_LINE,
    };
    Refusal::Error(err)
}

/// Decides `body`, `keep_alive` and `expect_continue` from the (lowercased) header fields, and
/// applies RFC 9112 §3.2: an HTTP/1.1 request has exactly one `Host` line, an HTTP/1.0 request
/// at most one (two could name different hosts to a proxy and to the app).
fn decide_framing(buf: &[u8], head: &mut Head) -> Result<(), HttpError> {
    let mut hosts = 0usize;
    let mut content_length: Option<u64> = None;
    let mut transfer_encoding = false;
    let mut codings = 0usize;
    let mut chunked_before_last = false;
    let mut last_is_chunked = false;
    let mut close = false;
    let mut keep_alive_token = false;
    let mut expect_continue = false;
    let mut upgrade = false;
    for (name, value) in head.header_fields(buf) {
        match name {
            b"content-length" => {
                for item in value.split(|&b| b == b',') {
                    let n = parse_decimal(trim_ows(item)).ok_or(BAD_CONTENT_LENGTH)?;
                    if content_length.is_some_and(|prev| prev != n) {
                        return Err(CONFLICTING_CONTENT_LENGTH);
                    }
                    content_length = Some(n);
                }
            }
            b"transfer-encoding" => {
                transfer_encoding = true;
                for coding in list_items(value) {
                    chunked_before_last |= last_is_chunked;
                    last_is_chunked = coding.eq_ignore_ascii_case(b"chunked");
                    codings += 1;
                }
            }
            b"connection" => {
                for token in list_items(value) {
                    close |= token.eq_ignore_ascii_case(b"close");
                    keep_alive_token |= token.eq_ignore_ascii_case(b"keep-alive");
                }
            }
            b"expect" => expect_continue |= value.eq_ignore_ascii_case(b"100-continue"),
            b"host" => hosts += 1,
            b"upgrade" => upgrade = true,
            _ => {}
        }
    }
    head.body = if transfer_encoding {
        if head.version == Version::Http10 {
            return Err(TE_IN_HTTP10);
        }
        if content_length.is_some() {
            return Err(TE_AND_CL);
        }
        if !last_is_chunked || chunked_before_last {
            return Err(TE_NOT_FINAL_CHUNKED);
        }
        if codings != 1 {
            return Err(TE_UNSUPPORTED);
        }
        BodyKind::Chunked
    } else {
        match content_length {
            None | Some(0) => BodyKind::Empty,
            Some(n) => BodyKind::Length(n),
        }
    };
    head.keep_alive = match head.version {
        Version::Http11 => !close,
        Version::Http10 => keep_alive_token && !close,
    };
    head.expect_continue = head.version == Version::Http11 && expect_continue;
    head.upgrade = upgrade;
    if hosts > 1 {
        return Err(SEVERAL_HOSTS);
    }
    if hosts == 0 && head.version == Version::Http11 {
        return Err(MISSING_HOST);
    }
    Ok(())
}

/// `1*DIGIT` as a u64; `None` if empty, not all digits, or overflowing.
pub(crate) fn parse_decimal(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &d| {
        if d.is_ascii_digit() {
            n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
        } else {
            None
        }
    })
}

/// The non-empty, trimmed elements of a comma-separated list (RFC 9110 §5.6.1).
pub(crate) fn list_items(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|&b| b == b',')
        .map(trim_ows)
        .filter(|item| !item.is_empty())
}

/// `value` without leading and trailing spaces and tabs (OWS).
pub(crate) fn trim_ows(value: &[u8]) -> &[u8] {
    let is_ows = |b: &u8| *b == b' ' || *b == b'\t';
    let start = value.iter().position(|b| !is_ows(b)).unwrap_or(value.len());
    let end = value
        .iter()
        .rposition(|b| !is_ows(b))
        .map_or(start, |i| i + 1);
    &value[start..end]
}

#[cfg(test)]
mod tests;
