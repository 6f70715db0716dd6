//! Compile-time limits of the bounded ZMTP SUB client (LOAD-ZMTP-13..15, KV-IDX-04, Q-03).
//!
//! Role: every length a peer declares is compared with one of these constants *before* any buffer
//! grows. [`ZmtpLimits::KV_METRICS`] and [`ZmtpLimits::KV_EVENTS`] are the two families.
//!
//! Invariants:
//! - [`ZmtpLimits::buffer_limit`] bounds the capacity of the state machine's frame buffer at every
//!   point; the buffer starts at [`INITIAL_FRAME_BUFFER_BYTES`] and doubles only after a declared
//!   length passed its check;
//! - an idle subscription holds at most [`INITIAL_FRAME_BUFFER_BYTES`] + [`WRITE_BUFFER_BYTES`] in
//!   the state machine; with the I/O layer's [`READ_BUFFER_BYTES`] that is
//!   [`IDLE_BUDGET_BYTES`] (2,624 B).

/// Length of a ZMTP 3.x greeting.
pub const GREETING_LEN: usize = 64;
/// Initial (and idle) capacity of the frame buffer (LOAD-ZMTP-14).
pub const INITIAL_FRAME_BUFFER_BYTES: usize = 512;
/// Read buffer the I/O layer owns per subscription (LOAD-ZMTP-15); not held by the state machine.
pub const READ_BUFFER_BYTES: usize = 2048;
/// Largest read buffer a busy subscription grows to (see [`read_buffer_after`]).
pub const BUSY_READ_BUFFER_BYTES: usize = 16 * 1024;

/// The read-buffer capacity to use after a read of `read` bytes into a buffer of `capacity`: a
/// read that filled the buffer means a backlog, so it doubles (up to [`BUSY_READ_BUFFER_BYTES`];
/// at ~9 messages per 2 KiB read the kernel cost per read dominates); a read that fit in the idle
/// size returns to [`READ_BUFFER_BYTES`], so a quiet subscription holds the 2 KiB of
/// LOAD-ZMTP-15. Changes only at a change of traffic regime.
pub const fn read_buffer_after(capacity: usize, read: usize) -> usize {
    if read >= capacity && capacity < BUSY_READ_BUFFER_BYTES {
        let doubled = capacity.saturating_mul(2);
        if doubled < BUSY_READ_BUFFER_BYTES {
            doubled
        } else {
            BUSY_READ_BUFFER_BYTES
        }
    } else if read <= READ_BUFFER_BYTES && capacity > READ_BUFFER_BYTES {
        READ_BUFFER_BYTES
    } else {
        capacity
    }
}

/// Idle write-side capacity: room for a PONG (LOAD-ZMTP-15).
pub const WRITE_BUFFER_BYTES: usize = 64;
/// Idle memory per subscription: frame buffer + read buffer + write buffer (LOAD-ZMTP-15).
pub const IDLE_BUDGET_BYTES: usize =
    INITIAL_FRAME_BUFFER_BYTES + READ_BUFFER_BYTES + WRITE_BUFFER_BYTES;
/// Most topics one SUB subscribes to.
pub const MAX_TOPICS: usize = 4;
/// Longest subscribed topic and the allowance for frame 0 of a message.
pub const MAX_TOPIC_BYTES: usize = 64;
/// Most frames of one message; the Dynamo layout has exactly 4 (LOAD-ZMTP-03).
pub const MAX_FRAMES: usize = 4;
/// Largest READY (or ERROR) command body accepted during the handshake.
pub const MAX_READY_BYTES: usize = 1024;
/// Largest command body accepted after the handshake (PING with its 16-byte context fits).
pub const MAX_COMMAND_BYTES: usize = 64;
/// Largest declared `payload_len` of a `kv_metrics` frame 3 (LOAD-ZMTP-09: 16 KiB).
pub const KV_METRICS_MAX_PAYLOAD_BYTES: u32 = 16_384;
/// Bytes of the frame-3 header: version u8 + payload_len u32 BE (LOAD-ZMTP-03).
pub const FRAME3_HEADER_BYTES: usize = 5;
/// `MAX_FRAME_BYTES` of the load family: the 5-byte header plus a 16 KiB envelope (16,389 B).
pub const KV_METRICS_MAX_FRAME_BYTES: usize =
    FRAME3_HEADER_BYTES + KV_METRICS_MAX_PAYLOAD_BYTES as usize;
/// `MAX_FRAME_BYTES` of the kv-events family: 1 MiB per frame (KV-IDX-04).
pub const KV_EVENTS_MAX_FRAME_BYTES: usize = 1 << 20;
/// Largest declared `payload_len` of a kv-events frame 3 (the frame cap minus the header).
pub const KV_EVENTS_MAX_PAYLOAD_BYTES: u32 =
    (KV_EVENTS_MAX_FRAME_BYTES - FRAME3_HEADER_BYTES) as u32;

/// The bounds one subscription enforces. Use the family constants; fields are public for tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZmtpLimits {
    /// Largest data frame body kept (`MAX_FRAME_BYTES`).
    pub max_frame_bytes: usize,
    /// Most frames of one message (clamped to [`MAX_FRAMES`]).
    pub max_frames: usize,
    /// Largest sum of the frame bodies of one message.
    pub max_message_bytes: usize,
    /// A data frame over the caps but declared at most this long is skipped without buffering and
    /// its message dropped as oversized; one declared longer ends the session.
    pub max_skip_bytes: u64,
    /// Largest command body during the handshake.
    pub max_ready_bytes: usize,
    /// Largest command body after the handshake.
    pub max_command_bytes: usize,
}

impl ZmtpLimits {
    /// `kv_metrics` (ActiveLoad samples): 16,389-byte frames, 16,469-byte messages.
    pub const KV_METRICS: Self = Self::family(KV_METRICS_MAX_FRAME_BYTES, 1 << 20);
    /// `kv-events` (RouterEvent batches): 1 MiB frames (KV-IDX-04).
    pub const KV_EVENTS: Self = Self::family(KV_EVENTS_MAX_FRAME_BYTES, 16 << 20);

    const fn family(max_frame_bytes: usize, max_skip_bytes: u64) -> Self {
        Self {
            max_frame_bytes,
            max_frames: MAX_FRAMES,
            // frame 0 (topic) + two 8-byte id frames + frame 3
            max_message_bytes: MAX_TOPIC_BYTES + 16 + max_frame_bytes,
            max_skip_bytes,
            max_ready_bytes: MAX_READY_BYTES,
            max_command_bytes: MAX_COMMAND_BYTES,
        }
    }

    /// The most frames a message may have, never above [`MAX_FRAMES`].
    pub const fn frames(&self) -> usize {
        if self.max_frames < MAX_FRAMES {
            self.max_frames
        } else {
            MAX_FRAMES
        }
    }

    /// Upper bound of the frame buffer's capacity: a whole message plus one post-handshake
    /// command arriving between its frames, or a READY command, or the initial capacity.
    pub const fn buffer_limit(&self) -> usize {
        let msg = self
            .max_message_bytes
            .saturating_add(self.max_command_bytes);
        let m = if msg > self.max_ready_bytes {
            msg
        } else {
            self.max_ready_bytes
        };
        if m > INITIAL_FRAME_BUFFER_BYTES {
            m
        } else {
            INITIAL_FRAME_BUFFER_BYTES
        }
    }
}

#[cfg(test)]
mod read_buffer_tests {
    use super::*;

    #[test]
    fn read_buffer_grows_under_backlog_and_returns_to_idle_size() {
        assert_eq!(read_buffer_after(2048, 100), 2048);
        assert_eq!(read_buffer_after(2048, 2048), 4096);
        assert_eq!(read_buffer_after(8192, 8192), 16384);
        assert_eq!(read_buffer_after(16384, 16384), 16384);
        assert_eq!(read_buffer_after(16384, 5000), 16384);
        assert_eq!(read_buffer_after(16384, 2048), 2048);
        assert_eq!(read_buffer_after(4096, 10), 2048);
    }
}
