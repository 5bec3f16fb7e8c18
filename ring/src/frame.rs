//! Framing of the ring messages (`RingToTrainer` / `RingToWorker`) on the
//! trainer's Unix socket, and the geometry of the slot ring: both sides of the
//! shared-memory transport use this one definition.

use bytes::{Buf, BytesMut};
use prost::Message;

/// Largest ring message accepted. Ring messages are a few dozen bytes; a
/// bigger length prefix means a confused or hostile peer.
pub const MAX_FRAME: usize = 64 * 1024;

/// Why a ring message could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The length prefix exceeds [`MAX_FRAME`].
    #[error("ring message of {0} bytes exceeds the limit of {MAX_FRAME}")]
    TooLarge(usize),
    /// The bytes are not a valid message.
    #[error("malformed ring message: {0}")]
    Decode(#[from] prost::DecodeError),
}

/// Encodes `msg` as one frame: u32 little-endian length, then the message.
pub fn encode<M: Message>(msg: &M) -> Vec<u8> {
    let mut out = Vec::new();
    encode_into(msg, &mut out);
    out
}

/// Appends `msg` to `out` as one frame, like [`encode`]: several frames can
/// share one buffer and one write.
pub fn encode_into<M: Message>(msg: &M, out: &mut Vec<u8>) {
    let len = msg.encoded_len();
    out.reserve(4 + len);
    out.extend_from_slice(&(len as u32).to_le_bytes());
    // A Vec grows as needed: writing the message cannot run out of room.
    msg.encode_raw(out);
}

/// Takes one complete frame off the front of `buf`, if there is one.
pub fn decode<M: Message + Default>(buf: &mut BytesMut) -> Result<Option<M>, FrameError> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    if len > MAX_FRAME {
        return Err(FrameError::TooLarge(len));
    }
    if buf.len() < 4 + len {
        return Ok(None);
    }
    buf.advance(4);
    let frame = buf.split_to(len);
    Ok(Some(M::decode(frame.freeze())?))
}

/// Most slots a ring may have, on both sides: the worker's book keeps a few
/// bytes per slot, and no sensible trainer prefetches more batches than
/// this.
pub const MAX_SLOTS: u32 = 1 << 16;

/// Where the slots of a ring lie in its shared-memory file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingGeometry {
    /// Bytes per slot; a multiple of the page size.
    pub slot_size: u64,
    /// Number of slots.
    pub slot_count: u32,
}

impl RingGeometry {
    /// Bytes of the whole ring, or None on overflow.
    pub fn total_len(&self) -> Option<u64> {
        self.slot_size.checked_mul(u64::from(self.slot_count))
    }

    /// Bytes of the memfd of a ring with a doorbell: the slots, then the
    /// doorbell page at offset [`total_len`](Self::total_len). None on
    /// overflow.
    pub fn file_len_with_doorbell(&self) -> Option<u64> {
        self.total_len()?.checked_add(crate::doorbell::DOORBELL_LEN)
    }

    /// Byte range of slot `slot`, or None when there is no such slot.
    pub fn slot_range(&self, slot: u32) -> Option<std::ops::Range<usize>> {
        if slot >= self.slot_count {
            return None;
        }
        let start = usize::try_from(self.slot_size.checked_mul(u64::from(slot))?).ok()?;
        let end = start.checked_add(usize::try_from(self.slot_size).ok()?)?;
        Some(start..end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loader_proto::pb::{RingToWorker, SlotGrant, ring_to_worker::Msg};

    #[test]
    fn frames_round_trip_and_split_anywhere() {
        let msgs: Vec<RingToWorker> = (0..3)
            .map(|i| RingToWorker { msg: Some(Msg::Grant(SlotGrant { slot: i, generation: u64::from(i) * 7 })) })
            .collect();
        let bytes: Vec<u8> = msgs.iter().flat_map(encode).collect();
        for cut in 0..bytes.len() {
            let mut buf = BytesMut::from(&bytes[..cut]);
            let mut got = Vec::new();
            while let Some(m) = decode::<RingToWorker>(&mut buf).expect("decode") {
                got.push(m);
            }
            buf.extend_from_slice(&bytes[cut..]);
            while let Some(m) = decode::<RingToWorker>(&mut buf).expect("decode") {
                got.push(m);
            }
            assert_eq!(got, msgs);
        }
    }

    #[test]
    fn oversized_and_garbage_frames_are_errors() {
        let mut buf = BytesMut::from(&u32::MAX.to_le_bytes()[..]);
        assert!(matches!(decode::<RingToWorker>(&mut buf), Err(FrameError::TooLarge(_))));
        let mut buf = BytesMut::from(&[3, 0, 0, 0, 0xff, 0xff, 0xff][..]);
        assert!(matches!(decode::<RingToWorker>(&mut buf), Err(FrameError::Decode(_))));
    }

    #[test]
    fn slots_stay_inside_the_ring() {
        let g = RingGeometry { slot_size: 4096, slot_count: 3 };
        assert_eq!(g.slot_range(2), Some(8192..12288));
        assert_eq!(g.slot_range(3), None);
        assert_eq!(g.total_len(), Some(12288));
        assert_eq!(g.file_len_with_doorbell(), Some(12288 + 4096));
        let huge = RingGeometry { slot_size: u64::MAX, slot_count: 2 };
        assert_eq!(huge.slot_range(1), None);
        assert_eq!(huge.total_len(), None);
        assert_eq!(huge.file_len_with_doorbell(), None);
    }
}
