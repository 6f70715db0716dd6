//! The byte budgets of the bus (BUS-27..29), as HTTP/2 settings and pipe sizes.
//!
//! Each data stream has, per direction, `per_stream_buffer_bytes` (B: `max_session_buffer_bytes /
//! (4 × max_streams_per_session)`, clamped to 16 KiB..=1 MiB). It covers four areas, a quarter
//! each:
//! - **inbound** (broker to router): the HTTP/2 receive window (B/4: what the broker may send
//!   before the router reads), the frame being moved into the pipe (a DATA frame never exceeds the
//!   window), the pipe to the stream's holder ([`PIPE_FRAMES`] = 1 frame of at most B/4), and the
//!   frame the holder took (a socket holder: the frame its pump is writing);
//! - **outbound** (router to broker): the pipe (1 chunk of at most B/4, [`crate::BusStream::send`]
//!   and the socket pump split larger writes), the chunk hyper is sending, hyper's per-stream send
//!   buffer (B/4), and the chunk a socket holder's pump has read.
//!
//! A socket holder's pair adds its kernel send buffers (B/4 each way, rounded up to the kernel's
//! minimum): kernel memory, not the process's. One pipe slot rather than two cost no measurable
//! throughput (`bench/run.sh bus-relay`).
//!
//! So a broker that sends faster than the router reads is held back by flow control once B is
//! in flight, and a session's streams together stay within `max_streams_per_session × 2B <=
//! max_session_buffer_bytes / 2`. The connection window is the sum of the streams' windows, so
//! one busy stream cannot starve the others. The control stream runs under the same window.

use continuum_core::config::dynamo::EventBusConfig;

/// Frames (or chunks) each pipe holds.
pub(crate) const PIPE_FRAMES: usize = 1;

/// HTTP/2's largest window.
const MAX_WINDOW: u64 = (1 << 31) - 1;

/// The HTTP/2 sizes of one connection, from the config in force when it was accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Windows {
    /// Each stream's receive window (B/4).
    pub(crate) stream: u32,
    /// The connection's receive window (every stream's window).
    pub(crate) connection: u32,
    /// Each stream's send buffer (B/4).
    pub(crate) send_buf: usize,
    /// The largest chunk a pipe carries (B/4).
    pub(crate) chunk: usize,
}

impl Windows {
    pub(crate) fn of(bus: &EventBusConfig) -> Self {
        let quarter = bus.per_stream_buffer_bytes() / 4;
        let streams = u64::from(bus.max_streams_per_session.max(1)) + 1;
        let connection = (quarter * streams).min(MAX_WINDOW);
        Self {
            stream: u32::try_from(quarter).unwrap_or(u32::MAX),
            connection: u32::try_from(connection).unwrap_or(u32::MAX),
            send_buf: usize::try_from(quarter).unwrap_or(usize::MAX),
            chunk: usize::try_from(quarter).unwrap_or(usize::MAX),
        }
    }

    /// Bytes one direction of a stream may hold at most: window, frame, pipe, the holder's frame.
    #[cfg(test)]
    pub(crate) fn per_direction(&self) -> u64 {
        u64::from(self.stream) * (3 + PIPE_FRAMES as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_four_areas_fill_the_per_stream_budget() {
        for (buffer, streams) in [
            (64u64 << 20, 1024u32),
            (64 << 20, 16),
            (1 << 30, 64),
            (1 << 20, 16),
        ] {
            let bus = EventBusConfig {
                max_session_buffer_bytes: buffer,
                max_streams_per_session: streams,
                ..EventBusConfig::default()
            };
            let w = Windows::of(&bus);
            assert_eq!(
                w.per_direction(),
                bus.per_stream_buffer_bytes(),
                "{buffer} {streams}"
            );
            assert!(u64::from(w.connection) >= u64::from(w.stream) * u64::from(streams));
            // Two directions of every stream fit half the session budget.
            assert!(
                u64::from(streams) * 2 * w.per_direction()
                    <= buffer.max(u64::from(streams) * (64 << 10))
            );
        }
        // The defaults: 16 KiB per stream and direction, 4 KiB windows.
        let w = Windows::of(&EventBusConfig::default());
        assert_eq!((w.stream, w.chunk), (4096, 4096));
    }
}
