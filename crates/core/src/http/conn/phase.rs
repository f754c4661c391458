//! The phases of an HTTP/1.1 server connection and the one table of their transitions.
//!
//! Invariant: a connection's phase changes only through [`Phase::after`], which reads
//! [`TRANSITIONS`]; a pair the table does not list is refused (`None`), never guessed. The
//! table is data: `Display for Transitions` prints it (`ferroloop_core::http::conn::Transitions`),
//! and the tests compare the print with the documented one.

use std::fmt;

/// Where a connection is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Waiting for a request head. The deadline is the keep-alive timeout, or the header
    /// timeout once part of a head has arrived (slowloris).
    Idle,
    /// A request is in flight: its body is read as the app asks, its response written as the
    /// app sends it. Pipelined requests wait in the read buffer.
    Busy,
    /// The last output is queued; once it is written the write side is shut.
    Closing,
    /// The write side is shut; input is read and discarded until the peer closes or the
    /// linger deadline passes, so unread input cannot turn the close into a reset that
    /// destroys the response.
    Lingering,
    /// Done: the socket is closed, or handed to another process. Nothing touches it again.
    Closed,
}

/// What moves a connection from one phase to another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Trigger {
    /// A complete request head was read and accepted: its exchange begins.
    Head,
    /// The response is complete and the connection may carry another request.
    KeepAlive,
    /// The last output is queued (a final response, an error answer, a WebSocket's end, a
    /// drained idle connection): close once it is written.
    Close,
    /// Everything queued was written and the write side shut.
    Shut,
    /// The idle connection leaves this process (to the dispatching front), with what was read.
    HandBack,
    /// Closed now: the peer went away, a deadline passed, a write failed, or the server aborts.
    Abort,
}

impl Phase {
    pub const ALL: [Phase; 5] = [
        Phase::Idle,
        Phase::Busy,
        Phase::Closing,
        Phase::Lingering,
        Phase::Closed,
    ];

    /// The phase `trigger` leads to from this one, if the table has that transition.
    #[must_use]
    pub fn after(self, trigger: Trigger) -> Option<Phase> {
        TABLE[self as usize][trigger as usize]
    }

    fn name(self) -> &'static str {
        match self {
            Phase::Idle => "Idle",
            Phase::Busy => "Busy",
            Phase::Closing => "Closing",
            Phase::Lingering => "Lingering",
            Phase::Closed => "Closed",
        }
    }
}

impl Trigger {
    pub const ALL: [Trigger; 6] = [
        Trigger::Head,
        Trigger::KeepAlive,
        Trigger::Close,
        Trigger::Shut,
        Trigger::HandBack,
        Trigger::Abort,
    ];

    fn name(self) -> &'static str {
        match self {
            Trigger::Head => "head",
            Trigger::KeepAlive => "keep-alive",
            Trigger::Close => "close",
            Trigger::Shut => "shut",
            Trigger::HandBack => "hand-back",
            Trigger::Abort => "abort",
        }
    }
}

/// One row of the table: from, trigger, to, and when it happens.
pub type Transition = (Phase, Trigger, Phase, &'static str);

/// Every transition a connection can make. Nothing else changes a phase.
pub const TRANSITIONS: [Transition; 10] = [
    (
        Phase::Idle,
        Trigger::Head,
        Phase::Busy,
        "a request head was read and accepted",
    ),
    (
        Phase::Idle,
        Trigger::Close,
        Phase::Closing,
        "an invalid head was answered, the client ended its input, or a drain or a timeout closes",
    ),
    (
        Phase::Idle,
        Trigger::HandBack,
        Phase::Closed,
        "the connection goes back to the front, with what was read",
    ),
    (
        Phase::Idle,
        Trigger::Abort,
        Phase::Closed,
        "nothing to write: closed at once",
    ),
    (
        Phase::Busy,
        Trigger::KeepAlive,
        Phase::Idle,
        "the response is complete and the connection may be reused",
    ),
    (
        Phase::Busy,
        Trigger::Close,
        Phase::Closing,
        "the last response (or an error answer, or a WebSocket's end) is queued",
    ),
    (
        Phase::Busy,
        Trigger::Abort,
        Phase::Closed,
        "the client is gone, a write failed, or a response was cut short",
    ),
    (
        Phase::Closing,
        Trigger::Shut,
        Phase::Lingering,
        "the output is written and the write side shut",
    ),
    (
        Phase::Closing,
        Trigger::Abort,
        Phase::Closed,
        "the client does not read, or shutting down failed",
    ),
    (
        Phase::Lingering,
        Trigger::Abort,
        Phase::Closed,
        "the client closed, or the linger deadline passed",
    ),
];

const PHASES: usize = Phase::ALL.len();
const TRIGGERS: usize = Trigger::ALL.len();

/// `TRANSITIONS` indexed by phase and trigger, built at compile time: one load per change.
const TABLE: [[Option<Phase>; TRIGGERS]; PHASES] = {
    let mut table = [[None; TRIGGERS]; PHASES];
    let mut i = 0;
    while i < TRANSITIONS.len() {
        let (from, trigger, to, _) = TRANSITIONS[i];
        assert!(
            table[from as usize][trigger as usize].is_none(),
            "a transition is listed twice"
        );
        table[from as usize][trigger as usize] = Some(to);
        i += 1;
    }
    table
};

/// Prints the transition table, one transition a line: `Idle --head--> Busy: when`.
pub struct Transitions;

impl fmt::Display for Transitions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (from, trigger, to, when) in TRANSITIONS {
            writeln!(
                f,
                "{:<9} --{}--> {}: {when}",
                from.name(),
                trigger.name(),
                to.name()
            )?;
        }
        Ok(())
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for Trigger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_printed_table_is_the_documented_one() {
        let expected = "\
Idle      --head--> Busy: a request head was read and accepted
Idle      --close--> Closing: an invalid head was answered, the client ended its input, or a drain or a timeout closes
Idle      --hand-back--> Closed: the connection goes back to the front, with what was read
Idle      --abort--> Closed: nothing to write: closed at once
Busy      --keep-alive--> Idle: the response is complete and the connection may be reused
Busy      --close--> Closing: the last response (or an error answer, or a WebSocket's end) is queued
Busy      --abort--> Closed: the client is gone, a write failed, or a response was cut short
Closing   --shut--> Lingering: the output is written and the write side shut
Closing   --abort--> Closed: the client does not read, or shutting down failed
Lingering --abort--> Closed: the client closed, or the linger deadline passed
";
        assert_eq!(Transitions.to_string(), expected);
    }

    #[test]
    fn only_listed_transitions_are_allowed() {
        for from in Phase::ALL {
            for trigger in Trigger::ALL {
                let listed = TRANSITIONS
                    .iter()
                    .find(|(f, t, _, _)| *f == from && *t == trigger)
                    .map(|(_, _, to, _)| *to);
                assert_eq!(from.after(trigger), listed, "{from} --{trigger}-->");
            }
        }
    }

    #[test]
    fn closed_is_final_and_every_other_phase_can_close() {
        for trigger in Trigger::ALL {
            assert_eq!(Phase::Closed.after(trigger), None);
        }
        for from in [Phase::Idle, Phase::Busy, Phase::Closing, Phase::Lingering] {
            assert_eq!(from.after(Trigger::Abort), Some(Phase::Closed));
        }
    }
}
