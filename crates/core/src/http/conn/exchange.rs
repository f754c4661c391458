//! One request and its response on a connection: what the connection knows of the request's
//! body and of the response's progress, and the driver's own data for it (`app`).
//!
//! Invariants: a body part is counted before it is written, and refused whole if it would pass
//! a declared `content-length` (nothing of it is written); the response head is written once,
//! before the first body part; nothing follows the last body part but the trailers it announced.

use std::fmt;

use super::super::{BodyDecoder, Framing, RequestInfo};

/// One request in flight, from its head to its complete response.
#[allow(
    clippy::struct_excessive_bools,
    reason = "independent facts of one request (an upgrade, 100-continue owed, the body \
              delivered, the client's end told), not one state"
)]
pub struct Exchange<T> {
    /// The request's number on its connection (1 for the first).
    pub seq: u64,
    /// What the response head needs to know of the request (version, HEAD, keep-alive).
    pub info: RequestInfo,
    /// The request is a protocol upgrade (a WebSocket): nothing is read or written after it as
    /// HTTP/1.1.
    pub upgrade: bool,
    pub(super) expect_continue: bool,
    pub(super) decoder: BodyDecoder,
    pub(super) body_bytes: u64,
    pub(super) body_delivered: bool,
    pub(super) disconnect_told: bool,
    /// The response's progress.
    pub resp: ResponseState,
    /// The driver's data for this request (its app's objects, waiters, a WebSocket session).
    pub app: T,
}

impl<T> Exchange<T> {
    /// The whole body was handed to the app.
    pub fn body_delivered(&self) -> bool {
        self.body_delivered
    }

    /// The app was told the client is gone while the connection was still open (the client
    /// half-closed): returning without a response is then its right, not its error.
    pub fn disconnect_told(&self) -> bool {
        self.disconnect_told
    }

    /// Body bytes handed to the app so far.
    pub fn body_bytes(&self) -> u64 {
        self.body_bytes
    }

    /// The client waits for `100 Continue` before its body, and has not been sent it.
    pub fn expects_continue(&self) -> bool {
        self.expect_continue
    }
}

/// The response's progress, as the connection checks it.
#[derive(Debug, Default)]
pub struct ResponseState {
    pub status: u16,
    /// `http.response.start` (or an error answer) was given.
    pub started: bool,
    /// Trailers were announced at the start.
    pub trailers: bool,
    /// Set when the head is written (with the first body part).
    pub framing: Option<Framing>,
    /// The last body part was given.
    pub body_done: bool,
    /// Body bytes sent so far, checked against a declared `content-length`.
    pub body_sent: u64,
    /// Trailer fields received so far, written after the last chunk.
    pub pending_trailers: Vec<(Vec<u8>, Vec<u8>)>,
}

/// A response part the connection refuses: the app's error, named as ASGI servers name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResponseError {
    StartedTwice,
    BodyBeforeStart,
    BodyAfterLast,
    TrailersUnannounced,
    /// A part would pass the declared length: `(sent with it, declared)`.
    LongerThanDeclared(u64, u64),
    /// The last part left the body short: `(sent, declared)`.
    ShorterThanDeclared(u64, u64),
}

impl fmt::Display for ResponseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::StartedTwice => f.write_str(
                "Unexpected ASGI message 'http.response.start' sent, after response already \
                 started.",
            ),
            Self::BodyBeforeStart => f.write_str(
                "Unexpected ASGI message 'http.response.body' sent, before 'http.response.start'.",
            ),
            Self::BodyAfterLast => f.write_str(
                "Unexpected ASGI message 'http.response.body' sent, after the last body part.",
            ),
            Self::TrailersUnannounced => f.write_str(
                "Unexpected ASGI message 'http.response.trailers': trailers were not announced \
                 in 'http.response.start', or the body is not finished",
            ),
            Self::LongerThanDeclared(sent, declared) => write!(
                f,
                "Response content longer than Content-Length: {sent} bytes sent, {declared} \
                 declared; nothing of this part was written"
            ),
            Self::ShorterThanDeclared(sent, declared) => write!(
                f,
                "Response content shorter than Content-Length: {sent} bytes sent, {declared} \
                 declared"
            ),
        }
    }
}

impl std::error::Error for ResponseError {}

impl ResponseState {
    /// `http.response.start`: refused if the response started already.
    pub fn start(&mut self, status: u16, trailers: bool) -> Result<(), ResponseError> {
        if self.started {
            return Err(ResponseError::StartedTwice);
        }
        self.status = status;
        self.started = true;
        self.trailers = trailers;
        Ok(())
    }

    /// Before a body part: refused before the start and after the last part.
    pub fn check_body_part(&self) -> Result<(), ResponseError> {
        if !self.started {
            return Err(ResponseError::BodyBeforeStart);
        }
        if self.body_done {
            return Err(ResponseError::BodyAfterLast);
        }
        Ok(())
    }

    /// Counts `len` more body bytes; refuses them (nothing written) past a declared length. A
    /// body that disagrees with the declared length would desynchronise the client: more bytes
    /// would be read as the next response, fewer would leave it waiting.
    pub fn count_body(&mut self, framing: Framing, len: u64) -> Result<(), ResponseError> {
        if let (true, Some(declared)) = (framing.send_body, framing.content_length) {
            let sent = self.body_sent + len;
            if sent > declared {
                return Err(ResponseError::LongerThanDeclared(sent, declared));
            }
            self.body_sent = sent;
        }
        Ok(())
    }

    /// After the last body part: the error if fewer bytes than declared were sent.
    pub fn short_of_declared(&self, framing: Framing) -> Option<ResponseError> {
        let declared = framing.content_length.filter(|_| framing.send_body)?;
        (self.body_sent < declared)
            .then_some(ResponseError::ShorterThanDeclared(self.body_sent, declared))
    }

    /// Trailers may be sent: announced, and after the last body part.
    pub fn check_trailers(&self) -> Result<Framing, ResponseError> {
        match self.framing {
            Some(framing) if self.trailers && self.body_done => Ok(framing),
            _ => Err(ResponseError::TrailersUnannounced),
        }
    }
}
