//! The trainer's view of one batch: the frame's bytes plus its validated
//! header, whichever transport delivered it.

use std::sync::Arc;

use bytes::Bytes;
use loader_process::telemetry::trace;
use loader_proto::batch::{BatchHeader, BatchView, TableCache};
use loader_proto::pb::Dtype;
use loader_ring::trainer::Filled;
use tracing::Span;

use crate::error::LoaderError;
use crate::pin::{Device, DeviceCopy, DeviceTensor};

/// What a frame must say about itself to belong to this session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Expected {
    /// The session's job.
    pub(crate) job_id: u64,
    /// The session's consumer (rank): what batch headers name.
    pub(crate) consumer: u32,
    /// The consumer its batches are delivered under (Fetch streams, ring
    /// reports): the rank, or on a shared stream the session's subscriber.
    pub(crate) stream: u32,
    /// To turn a sequence number into (epoch, index in epoch).
    pub(crate) batches_per_epoch: u64,
    /// Sequence numbers run `0..total`; anything else is a lie.
    pub(crate) total: u64,
}

/// How a batch reached this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Transport {
    /// Written by a co-located worker into a slot of this trainer's
    /// shared-memory ring; the batch's bytes are a view of that slot, which
    /// is reused once every clone of the batch is dropped.
    SharedMemory,
    /// Streamed by a worker over gRPC (`BatchService.Fetch`).
    Grpc,
}

/// One batch: contiguous bytes in the Loader wire format and the header that
/// was checked against them. Cloning is cheap (the bytes are shared). With
/// shared memory, holding a batch (or any clone) holds its ring slot: drop
/// batches when done with them so workers can refill the slots.
///
/// A loader with a [`device`](crate::LoaderBuilder::device) yields batches
/// on that device: [`Batch::on_device`] and [`Batch::device_tensors`] give
/// the device addresses and the copy's event; the host bytes are gone (the
/// slot went back to the workers once the copy completed), so
/// [`Batch::bytes`] is empty and [`Batch::tensors`] have empty `bytes`.
#[derive(Debug, Clone)]
pub struct Batch {
    /// The whole frame; tensors are slices of it, never copies. For a ring
    /// slot, the view that gives the slot back when the last clone drops.
    /// Empty for a batch on a device.
    bytes: Bytes,
    /// Where the frame lies on a device, for a loader with one; the device
    /// buffer returns to the pool when the last clone drops.
    device: Option<Arc<DeviceCopy>>,
    /// The transport that delivered it.
    transport: Transport,
    /// Parsed once on arrival so accessors never re-validate.
    header: BatchHeader,
    /// Kept to answer `index_in_epoch` without the job at hand.
    batches_per_epoch: u64,
    /// The `batch.consume` span of a batch sampled for tracing: from its
    /// arrival until `next()` hands it over. [`Span::none`] otherwise.
    consume: Span,
}

impl Batch {
    /// Validates a frame from the worker at `address`: the wire format first
    /// (every offset against the buffer), then that it belongs to this
    /// session. Errors name the worker so a bad peer can be found. `tables`
    /// is the stream's: a tensor table like the last one is not parsed again.
    pub(crate) fn from_frame(
        bytes: Bytes,
        expected: &Expected,
        address: &str,
        tables: &mut TableCache,
    ) -> Result<Self, LoaderError> {
        Self::validate(bytes, Transport::Grpc, expected, address, tables)
    }

    /// Validates a batch a worker wrote into a ring slot; `bytes` view the
    /// slot's first `len` bytes. The same checks as a gRPC frame.
    pub(crate) fn from_slot(
        bytes: Bytes,
        expected: &Expected,
        address: &str,
        tables: &mut TableCache,
    ) -> Result<Self, LoaderError> {
        Self::validate(bytes, Transport::SharedMemory, expected, address, tables)
    }

    /// Validates a batch a worker wrote into a ring slot and reported
    /// filled: the same checks as a gRPC frame, and the sequence number the
    /// report named must be the header's. The consumer's `parse` for the
    /// ring's inbox.
    pub(crate) fn from_filled(filled: Filled<'_>, expected: &Expected) -> Result<Self, LoaderError> {
        let Filled { view, slot, seq, traceparent, worker, tables } = filled;
        let batch = Self::from_slot(view, expected, &worker.address, tables)?.traced(traceparent);
        if batch.seq() != seq {
            return Err(LoaderError::BadBatch {
                address: worker.address.clone(),
                problem: format!("reported batch {seq} in slot {slot}, but its header says {}", batch.seq()),
            });
        }
        Ok(batch)
    }

    fn validate(
        bytes: Bytes,
        transport: Transport,
        expected: &Expected,
        address: &str,
        tables: &mut TableCache,
    ) -> Result<Self, LoaderError> {
        let bad = |problem: String| LoaderError::BadBatch {
            address: address.to_owned(),
            problem,
        };
        let header = BatchView::parse_cached(&bytes, tables)
            .map_err(|e| bad(e.to_string()))?
            .into_header();
        let meta = header.meta;
        if meta.job_id != expected.job_id {
            return Err(bad(format!(
                "batch header says job {}, expected {}",
                meta.job_id, expected.job_id
            )));
        }
        if meta.consumer != expected.consumer {
            return Err(bad(format!(
                "batch header says consumer {}, expected {}",
                meta.consumer, expected.consumer
            )));
        }
        if meta.seq >= expected.total {
            return Err(bad(format!(
                "batch header says seq {}, but the job has {} batches per consumer",
                meta.seq, expected.total
            )));
        }
        let per = expected.batches_per_epoch.max(1);
        if u64::from(meta.epoch) != meta.seq / per {
            return Err(bad(format!(
                "batch header says epoch {} for seq {}, expected epoch {}",
                meta.epoch,
                meta.seq,
                meta.seq / per
            )));
        }
        Ok(Batch {
            bytes,
            device: None,
            transport,
            header,
            batches_per_epoch: per,
            consume: Span::none(),
        })
    }

    /// Starts the batch's `batch.consume` span, a child of the worker's
    /// delivery span whose `traceparent` came with it (nothing when empty:
    /// the batch is not traced).
    pub(crate) fn traced(mut self, traceparent: &str) -> Self {
        let meta = self.header.meta;
        let transport = match self.transport {
            Transport::Grpc => "grpc",
            Transport::SharedMemory => "ring",
        };
        self.consume = trace::child_of(traceparent, || {
            tracing::info_span!(
                "batch.consume",
                job_id = meta.job_id,
                consumer = meta.consumer,
                seq = meta.seq,
                transport
            )
        });
        self
    }

    /// Ends the `batch.consume` span: `next()` hands the batch over.
    pub(crate) fn consumed(&mut self) {
        self.consume = Span::none();
    }

    /// This batch as it is on a device once `copy` completes: the same
    /// header, no host bytes (the caller keeps this batch, and with it the
    /// slot, until the copy's event).
    pub(crate) fn onto_device(&self, copy: DeviceCopy) -> Batch {
        Batch {
            bytes: Bytes::new(),
            device: Some(Arc::new(copy)),
            transport: self.transport,
            header: self.header.clone(),
            batches_per_epoch: self.batches_per_epoch,
            // The consumer ended the span when it handed the host batch to
            // the pin stage.
            consume: Span::none(),
        }
    }

    /// The device this batch is on ([`Device::Cpu`] for host bytes).
    pub fn device(&self) -> Device {
        self.device.as_ref().map_or(Device::Cpu, |d| d.device())
    }

    /// Where the batch lies on a device and its copy's event; None for a
    /// batch in host memory.
    pub fn on_device(&self) -> Option<&DeviceCopy> {
        self.device.as_deref()
    }

    /// The tensors on the device, in the order the worker wrote them; empty
    /// for a batch in host memory. Wait on the copy
    /// ([`DeviceCopy::wait_on_stream`] or [`DeviceCopy::wait`]) before any
    /// kernel reads them.
    pub fn device_tensors(&self) -> impl ExactSizeIterator<Item = DeviceTensor<'_>> + '_ {
        let base = self.device.as_ref().map(|d| d.ptr());
        let tensors = if base.is_some() {
            &self.header.tensors[..]
        } else {
            &[]
        };
        tensors.iter().map(move |t| DeviceTensor {
            name: &t.name,
            dtype: t.dtype,
            shape: &t.shape,
            ptr: base.unwrap_or(0) + t.offset as u64,
            len: t.len,
        })
    }

    /// The device tensor called `name`.
    pub fn device_tensor(&self, name: &str) -> Option<DeviceTensor<'_>> {
        self.device_tensors().find(|t| t.name == name)
    }

    /// How the batch reached this process.
    pub fn transport(&self) -> Transport {
        self.transport
    }

    /// Moves the bytes out of whatever holds them (a ring slot) into memory
    /// of their own, so the slot can be reused while the batch waits.
    pub(crate) fn copy_out(&mut self) {
        self.bytes = Bytes::copy_from_slice(&self.bytes);
    }

    /// Epoch of the batch.
    pub fn epoch(&self) -> u32 {
        self.header.meta.epoch
    }

    /// Consumer-local sequence number: `epoch * batches_per_epoch + index`.
    pub fn seq(&self) -> u64 {
        self.header.meta.seq
    }

    /// Position of the batch within its epoch (what `enumerate(loader)` gives
    /// in PyTorch).
    pub fn index_in_epoch(&self) -> u64 {
        self.header.meta.seq % self.batches_per_epoch
    }

    /// Dataset indices of the samples, in batch order.
    pub fn indices(&self) -> &[u64] {
        &self.header.indices
    }

    /// Samples in the batch.
    pub fn len(&self) -> usize {
        self.header.indices.len()
    }

    /// True for a batch with no samples (never produced by a valid job).
    pub fn is_empty(&self) -> bool {
        self.header.indices.is_empty()
    }

    /// The tensors, in the order the worker wrote them.
    pub fn tensors(&self) -> impl ExactSizeIterator<Item = Tensor<'_>> + '_ {
        self.header.tensors.iter().map(|t| Tensor {
            name: &t.name,
            dtype: t.dtype,
            shape: &t.shape,
            // In bounds: checked against these very bytes in `from_frame`.
            bytes: self
                .bytes
                .get(t.offset..t.offset + t.len)
                .unwrap_or_default(),
        })
    }

    /// The tensor called `name` ("data", "label", "tokens", ...).
    pub fn tensor(&self, name: &str) -> Option<Tensor<'_>> {
        self.tensors().find(|t| t.name == name)
    }

    /// The whole batch in the wire format (header, table and payloads).
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// The validated header.
    pub fn header(&self) -> &BatchHeader {
        &self.header
    }
}

/// One tensor of a batch, borrowed from the batch's bytes.
#[derive(Debug, Clone, Copy)]
pub struct Tensor<'a> {
    /// Name the worker gave it.
    pub name: &'a str,
    /// Element type.
    pub dtype: Dtype,
    /// Shape, batch dimension first.
    pub shape: &'a [u64],
    /// Raw little-endian payload (64-byte aligned within the batch).
    pub bytes: &'a [u8],
}

impl Tensor<'_> {
    /// Elements in the tensor.
    pub fn numel(&self) -> usize {
        self.bytes.len().checked_div(self.dtype.size()).unwrap_or(0)
    }

    /// Copies the payload out as `T`s. `T` must have the dtype's element size
    /// (e.g. `u8` for uint8, `i64` for int64, `u16` for float16 bits).
    pub fn to_vec<T: bytemuck::Pod>(&self) -> Result<Vec<T>, LoaderError> {
        self.check::<T>()?;
        let mut out = vec![T::zeroed(); self.bytes.len() / std::mem::size_of::<T>()];
        // A Vec<T> is aligned for T, so viewing it as bytes always works.
        bytemuck::cast_slice_mut::<T, u8>(&mut out).copy_from_slice(self.bytes);
        Ok(out)
    }

    /// The payload as `&[T]` without copying, when the bytes are aligned for
    /// `T` (they are within the batch; the frame's own base may not be) and
    /// `T` has the dtype's element size. Fall back to [`Tensor::to_vec`].
    pub fn as_slice<T: bytemuck::Pod>(&self) -> Option<&[T]> {
        self.check::<T>().ok()?;
        bytemuck::try_cast_slice(self.bytes).ok()
    }

    fn check<T>(&self) -> Result<(), LoaderError> {
        let size = self.dtype.size();
        if size != 0 && size == std::mem::size_of::<T>() {
            return Ok(());
        }
        Err(LoaderError::DtypeMismatch {
            tensor: self.name.to_owned(),
            dtype: self.dtype.short_name(),
            size,
            requested: std::any::type_name::<T>(),
        })
    }
}

#[cfg(test)]
mod tests {
    use loader_proto::batch::{BatchLayout, BatchMeta, TensorDesc};

    use super::*;

    const EXPECTED: Expected = Expected {
        job_id: 7,
        consumer: 1,
        stream: 1,
        batches_per_epoch: 4,
        total: 8,
    };

    /// A batch as a worker would write it: `data` [n, 3] uint8 and `label` [n] int64.
    fn frame(job_id: u64, consumer: u32, seq: u64, indices: &[u64]) -> Bytes {
        let n = indices.len() as u64;
        let layout = BatchLayout::new(
            indices.len(),
            vec![
                TensorDesc {
                    name: "data".into(),
                    dtype: Dtype::U8,
                    shape: vec![n, 3],
                },
                TensorDesc {
                    name: "label".into(),
                    dtype: Dtype::I64,
                    shape: vec![n],
                },
            ],
        )
        .expect("layout");
        let mut buf = vec![0u8; layout.total_len()];
        let meta = BatchMeta {
            job_id,
            epoch: (seq / 4) as u32,
            consumer,
            seq,
        };
        let mut payloads = layout.write(&meta, indices, &mut buf).expect("write");
        for (i, b) in payloads[0].iter_mut().enumerate() {
            *b = i as u8;
        }
        for (i, idx) in indices.iter().enumerate() {
            payloads[1][8 * i..8 * i + 8].copy_from_slice(&(*idx as i64).to_le_bytes());
        }
        Bytes::from(buf)
    }

    #[test]
    fn accessors_read_the_frame() {
        let b = Batch::from_frame(
            frame(7, 1, 5, &[10, 11]),
            &EXPECTED,
            "http://w:1",
            &mut TableCache::default(),
        )
        .expect("valid");
        assert_eq!((b.epoch(), b.seq(), b.index_in_epoch()), (1, 5, 1));
        assert_eq!(b.indices(), &[10, 11]);
        assert_eq!(b.len(), 2);
        assert_eq!(
            b.tensors().map(|t| t.name).collect::<Vec<_>>(),
            ["data", "label"]
        );
        let data = b.tensor("data").expect("data");
        assert_eq!(data.shape, &[2, 3]);
        assert_eq!(data.to_vec::<u8>().expect("u8"), vec![0, 1, 2, 3, 4, 5]);
        assert_eq!(data.numel(), 6);
        let label = b.tensor("label").expect("label");
        assert_eq!(label.to_vec::<i64>().expect("i64"), vec![10, 11]);
        assert!(b.tensor("nope").is_none());
    }

    #[test]
    fn as_slice_is_zero_copy_when_aligned_and_checks_size() {
        let b = Batch::from_frame(
            frame(7, 1, 0, &[3, 4, 5]),
            &EXPECTED,
            "http://w:1",
            &mut TableCache::default(),
        )
        .expect("valid");
        let label = b.tensor("label").expect("label");
        if let Some(s) = label.as_slice::<i64>() {
            assert_eq!(s, &[3, 4, 5]);
            assert_eq!(s.as_ptr().cast::<u8>(), label.bytes.as_ptr());
        }
        assert!(label.as_slice::<u8>().is_none());
        let e = label.to_vec::<f32>().expect_err("size mismatch");
        assert!(e.to_string().contains("int64"), "{e}");
    }

    #[test]
    fn wrong_job_or_consumer_names_the_worker() {
        let e = Batch::from_frame(
            frame(3, 1, 0, &[1]),
            &EXPECTED,
            "http://10.0.0.5:7070",
            &mut TableCache::default(),
        )
        .expect_err("job");
        assert_eq!(
            e.to_string(),
            "worker http://10.0.0.5:7070: batch header says job 3, expected 7"
        );
        let e = Batch::from_frame(
            frame(7, 0, 0, &[1]),
            &EXPECTED,
            "http://w:2",
            &mut TableCache::default(),
        )
        .expect_err("consumer");
        assert_eq!(
            e.to_string(),
            "worker http://w:2: batch header says consumer 0, expected 1"
        );
        let e = Batch::from_frame(
            frame(7, 1, 8, &[1]),
            &EXPECTED,
            "http://w:2",
            &mut TableCache::default(),
        )
        .expect_err("seq");
        assert!(e.to_string().contains("seq 8"), "{e}");
    }

    #[test]
    fn garbage_is_an_error_naming_the_worker() {
        let e = Batch::from_frame(
            Bytes::from_static(b"not a batch at all"),
            &EXPECTED,
            "http://w:3",
            &mut TableCache::default(),
        )
        .expect_err("garbage");
        assert!(e.to_string().starts_with("worker http://w:3: "), "{e}");
        let mut truncated = frame(7, 1, 0, &[1, 2]).to_vec();
        truncated.truncate(100);
        let e = Batch::from_frame(
            Bytes::from(truncated),
            &EXPECTED,
            "http://w:3",
            &mut TableCache::default(),
        )
        .expect_err("truncated");
        assert!(e.to_string().contains("truncated"), "{e}");
    }
}
