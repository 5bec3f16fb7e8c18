//! The batch wire format: one contiguous buffer that holds a whole batch.
//!
//! The same bytes sit in a shared-memory slot and in a gRPC [`BatchFrame`],
//! so a batch is written once, in place, and viewed without copying.
//!
//! ```text
//! offset  field (little-endian)
//!      0  magic "LDRB"
//!      4  version u16, flags u16 (0)
//!      8  total_len u64        bytes of the whole batch, payloads included
//!     16  job_id u64
//!     24  seq u64              consumer-local sequence number
//!     32  epoch u32, consumer u32
//!     40  sample_count u32, tensor_count u32
//!     48  table_offset u64     = 64 + 8 * sample_count
//!     56  reserved u64 (0)
//!     64  sample indices       sample_count x u64
//!  table  per tensor: offset u64, length u64, dtype u8, ndim u8,
//!         name_len u16, reserved u32, shape ndim x u64, name (padded to 8)
//!         payloads, each at a 64-byte aligned offset after the table
//! ```
//!
//! Every reader goes through [`BatchView::parse`], which checks every offset
//! and length against the buffer it holds before anything is read: a lying
//! header is an error, never an out-of-bounds read.
//!
//! [`BatchFrame`]: crate::pb::BatchFrame

use std::sync::Arc;

use crate::pb::Dtype;

/// First four bytes of every batch.
pub const MAGIC: [u8; 4] = *b"LDRB";
/// Version of the layout written by this crate.
pub const VERSION: u16 = 1;
/// Alignment of every tensor payload, in bytes (a cache line; enough for any
/// dtype and for SIMD loads).
pub const ALIGN: usize = 64;
/// Size of the fixed header.
pub const FIXED_HEADER_LEN: usize = 64;
/// Most tensors one batch may carry.
pub const MAX_TENSORS: usize = 64;
/// Most dimensions one tensor may have.
pub const MAX_NDIM: usize = 8;
/// Longest tensor name, in bytes.
pub const MAX_NAME_LEN: usize = 255;
/// Most samples one batch may carry.
pub const MAX_SAMPLES: usize = 1 << 24;

const ENTRY_FIXED_LEN: usize = 24;
/// Largest table entry of one tensor: [`MAX_NDIM`] dimensions and a name
/// of [`MAX_NAME_LEN`] bytes.
pub const MAX_ENTRY_LEN: usize = entry_len(MAX_NDIM, MAX_NAME_LEN);

/// What is wrong with a batch buffer or a batch layout.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    /// The buffer ends before a field it must hold.
    #[error("batch truncated: {what} needs {need} bytes, buffer has {have}")]
    Truncated {
        /// The field that did not fit.
        what: &'static str,
        /// Bytes needed.
        need: u64,
        /// Bytes available.
        have: u64,
    },
    /// The buffer does not start with [`MAGIC`].
    #[error("not a Loader batch: bad magic {0:02x?}")]
    BadMagic([u8; 4]),
    /// Written by an incompatible version.
    #[error("unsupported batch version {0} (this build reads version {VERSION})")]
    UnsupportedVersion(u16),
    /// A header field holds an impossible value.
    #[error("invalid batch header: {0}")]
    Invalid(String),
    /// A layout to be written is impossible.
    #[error("invalid batch layout: {0}")]
    Layout(String),
}

/// Identity of a batch: which job, epoch and consumer it belongs to, and its
/// place in that consumer's sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BatchMeta {
    /// Job the batch belongs to.
    pub job_id: u64,
    /// Epoch of the batch.
    pub epoch: u32,
    /// Data-parallel rank that receives it.
    pub consumer: u32,
    /// Consumer-local sequence number: `epoch * batches_per_epoch + batch`.
    pub seq: u64,
}

/// A tensor of a batch to be written: the full batched shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorDesc {
    /// Name the trainer looks the tensor up by ("data", "label", ...).
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Shape, batch dimension first.
    pub shape: Vec<u64>,
}

/// A tensor of a parsed batch: where its payload lies in the buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// Tensor name.
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Shape, batch dimension first.
    pub shape: Vec<u64>,
    /// Byte offset of the payload in the batch buffer (64-byte aligned).
    pub offset: usize,
    /// Payload length in bytes (= product of shape x dtype size).
    pub len: usize,
}

/// Bytes of a tensor with this dtype and shape, or None on overflow.
pub fn tensor_bytes(dtype: Dtype, shape: &[u64]) -> Option<u64> {
    shape
        .iter()
        .try_fold(dtype.size() as u64, |acc, &d| acc.checked_mul(d))
}

fn align_up(x: usize, to: usize) -> Option<usize> {
    x.checked_add(to - 1).map(|v| v / to * to)
}

const fn entry_len(ndim: usize, name_len: usize) -> usize {
    ENTRY_FIXED_LEN + 8 * ndim + name_len.div_ceil(8) * 8
}

/// Where everything of a batch goes, computed once per batch shape so that a
/// worker can size a buffer (or pick a slot) before writing into it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchLayout {
    sample_count: usize,
    table_offset: usize,
    tensors: Vec<TensorInfo>,
    total_len: usize,
}

impl BatchLayout {
    /// Lays out a batch of `sample_count` samples holding `tensors`.
    pub fn new(sample_count: usize, tensors: Vec<TensorDesc>) -> Result<Self, BatchError> {
        let bad = |m: String| Err(BatchError::Layout(m));
        if sample_count > MAX_SAMPLES {
            return bad(format!("{sample_count} samples exceeds the limit of {MAX_SAMPLES}"));
        }
        if tensors.len() > MAX_TENSORS {
            return bad(format!("{} tensors exceeds the limit of {MAX_TENSORS}", tensors.len()));
        }
        let table_offset = FIXED_HEADER_LEN + 8 * sample_count;
        let mut cursor = table_offset;
        for t in &tensors {
            if t.name.len() > MAX_NAME_LEN || t.name.is_empty() {
                return bad(format!("tensor name {:?} must be 1..={MAX_NAME_LEN} bytes", t.name));
            }
            if t.shape.len() > MAX_NDIM {
                return bad(format!("tensor {:?} has {} dims, the limit is {MAX_NDIM}", t.name, t.shape.len()));
            }
            if t.dtype == Dtype::Unspecified {
                return bad(format!("tensor {:?} has no dtype", t.name));
            }
            cursor += entry_len(t.shape.len(), t.name.len());
        }
        let mut offset = cursor;
        let mut infos = Vec::with_capacity(tensors.len());
        for t in tensors {
            let Some(len) = tensor_bytes(t.dtype, &t.shape).and_then(|l| usize::try_from(l).ok()) else {
                return bad(format!("tensor {:?} of shape {:?} is too large", t.name, t.shape));
            };
            let Some(start) = align_up(offset, ALIGN) else {
                return bad("batch too large".into());
            };
            let Some(end) = start.checked_add(len) else {
                return bad("batch too large".into());
            };
            infos.push(TensorInfo { name: t.name, dtype: t.dtype, shape: t.shape, offset: start, len });
            offset = end;
        }
        Ok(Self { sample_count, table_offset, tensors: infos, total_len: offset })
    }

    /// The layout of the same batch holding only its first `samples`
    /// samples, for a batch that lost samples while it was being written
    /// (corrupt samples skipped): every payload keeps its offset, so the
    /// rows already written stay where they are, and only the header, the
    /// index list and the tensor table are written again (by
    /// [`write`](Self::write), which leaves payloads alone). The table moves
    /// forward and the payloads shrink, so everything the parser checks
    /// still holds. Every tensor must have the batch as its leading
    /// dimension.
    pub fn truncated(&self, samples: usize) -> Result<BatchLayout, BatchError> {
        if samples > self.sample_count {
            return Err(BatchError::Layout(format!(
                "cannot grow a batch of {} samples to {samples}",
                self.sample_count
            )));
        }
        let table_offset = FIXED_HEADER_LEN + 8 * samples;
        let mut table_end = table_offset;
        let mut total_len = 0;
        let mut tensors = Vec::with_capacity(self.tensors.len());
        for t in &self.tensors {
            if t.shape.first() != Some(&(self.sample_count as u64)) {
                return Err(BatchError::Layout(format!(
                    "tensor {:?} of shape {:?} has no leading batch dimension of {}",
                    t.name, t.shape, self.sample_count
                )));
            }
            let mut shape = t.shape.clone();
            shape[0] = samples as u64;
            // Never larger than the original length, which fit a usize.
            let len = tensor_bytes(t.dtype, &shape).map_or(t.len, |l| l as usize);
            table_end += entry_len(shape.len(), t.name.len());
            total_len = total_len.max(t.offset + len);
            tensors.push(TensorInfo { name: t.name.clone(), dtype: t.dtype, shape, offset: t.offset, len });
        }
        Ok(Self { sample_count: samples, table_offset, tensors, total_len: total_len.max(table_end) })
    }

    /// Bytes of the whole batch.
    pub fn total_len(&self) -> usize {
        self.total_len
    }

    /// Samples the batch holds.
    pub fn sample_count(&self) -> usize {
        self.sample_count
    }

    /// The tensors and where their payloads go.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// Writes the header, the sample indices and the tensor table into the
    /// front of `buf` and returns the payload slices, one per tensor, for the
    /// caller to collate into. `buf` may be longer than the batch (a slot).
    pub fn write<'a>(
        &self,
        meta: &BatchMeta,
        indices: &[u64],
        buf: &'a mut [u8],
    ) -> Result<Vec<&'a mut [u8]>, BatchError> {
        if indices.len() != self.sample_count {
            return Err(BatchError::Layout(format!(
                "{} indices for a layout of {} samples",
                indices.len(),
                self.sample_count
            )));
        }
        if buf.len() < self.total_len {
            return Err(BatchError::Layout(format!(
                "batch of {} bytes does not fit a buffer of {} bytes",
                self.total_len,
                buf.len()
            )));
        }
        let h = &mut buf[..FIXED_HEADER_LEN];
        h[0..4].copy_from_slice(&MAGIC);
        h[4..6].copy_from_slice(&VERSION.to_le_bytes());
        h[6..8].copy_from_slice(&0u16.to_le_bytes());
        h[8..16].copy_from_slice(&(self.total_len as u64).to_le_bytes());
        h[16..24].copy_from_slice(&meta.job_id.to_le_bytes());
        h[24..32].copy_from_slice(&meta.seq.to_le_bytes());
        h[32..36].copy_from_slice(&meta.epoch.to_le_bytes());
        h[36..40].copy_from_slice(&meta.consumer.to_le_bytes());
        h[40..44].copy_from_slice(&(self.sample_count as u32).to_le_bytes());
        h[44..48].copy_from_slice(&(self.tensors.len() as u32).to_le_bytes());
        h[48..56].copy_from_slice(&(self.table_offset as u64).to_le_bytes());
        h[56..64].fill(0);
        for (i, idx) in indices.iter().enumerate() {
            let at = FIXED_HEADER_LEN + 8 * i;
            buf[at..at + 8].copy_from_slice(&idx.to_le_bytes());
        }
        let mut at = self.table_offset;
        for t in &self.tensors {
            let e = &mut buf[at..at + entry_len(t.shape.len(), t.name.len())];
            e[0..8].copy_from_slice(&(t.offset as u64).to_le_bytes());
            e[8..16].copy_from_slice(&(t.len as u64).to_le_bytes());
            e[16] = t.dtype.code();
            e[17] = t.shape.len() as u8;
            e[18..20].copy_from_slice(&(t.name.len() as u16).to_le_bytes());
            e[20..24].fill(0);
            for (d, dim) in t.shape.iter().enumerate() {
                e[24 + 8 * d..32 + 8 * d].copy_from_slice(&dim.to_le_bytes());
            }
            let name_at = 24 + 8 * t.shape.len();
            e[name_at..name_at + t.name.len()].copy_from_slice(t.name.as_bytes());
            e[name_at + t.name.len()..].fill(0);
            at += e.len();
        }
        // Hand out disjoint payload slices. The padding before each (up to
        // 63 bytes, and what a truncated layout's payloads no longer hold)
        // is zeroed: a reused slot or buffer still holds an earlier batch's
        // bytes there, and a batch's bytes must be a function of its
        // samples (checksums of the whole batch, the device copy's check).
        let mut rest = &mut buf[at..self.total_len.max(at)];
        let mut consumed = at;
        let mut out = Vec::with_capacity(self.tensors.len());
        for t in &self.tensors {
            let (gap, tail) = rest.split_at_mut(t.offset - consumed);
            gap.fill(0);
            let (payload, tail) = tail.split_at_mut(t.len);
            out.push(payload);
            rest = tail;
            consumed = t.offset + t.len;
        }
        Ok(out)
    }
}

/// A parsed batch header: identity, sample indices and the tensor table, all
/// checked against the buffer it was parsed from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchHeader {
    /// Which job, epoch, consumer and sequence number.
    pub meta: BatchMeta,
    /// Dataset indices of the samples, in batch order.
    pub indices: Vec<u64>,
    /// Tensor table; shared by the batches of a stream that had the same
    /// table (see [`TableCache`]).
    pub tensors: Arc<[TensorInfo]>,
    /// Bytes of the batch (<= the buffer it was parsed from).
    pub total_len: usize,
}

/// A batch buffer whose header has been validated: tensor payloads can be
/// sliced out without further checks.
#[derive(Debug, Clone)]
pub struct BatchView<'a> {
    buf: &'a [u8],
    header: BatchHeader,
}

struct Reader<'a> {
    buf: &'a [u8],
}

impl Reader<'_> {
    fn bytes(&self, at: usize, n: usize, what: &'static str) -> Result<&[u8], BatchError> {
        at.checked_add(n)
            .and_then(|end| self.buf.get(at..end))
            .ok_or(BatchError::Truncated {
                what,
                need: (at as u64).saturating_add(n as u64),
                have: self.buf.len() as u64,
            })
    }
    fn u64(&self, at: usize, what: &'static str) -> Result<u64, BatchError> {
        let b = self.bytes(at, 8, what)?;
        Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }
    fn u32(&self, at: usize, what: &'static str) -> Result<u32, BatchError> {
        let b = self.bytes(at, 4, what)?;
        Ok(u32::from_le_bytes(b.try_into().expect("4 bytes")))
    }
    fn u16(&self, at: usize, what: &'static str) -> Result<u16, BatchError> {
        let b = self.bytes(at, 2, what)?;
        Ok(u16::from_le_bytes(b.try_into().expect("2 bytes")))
    }
}

fn invalid<T>(msg: String) -> Result<T, BatchError> {
    Err(BatchError::Invalid(msg))
}

/// The last tensor table one stream of batches carried, with what it
/// parsed to. Every batch of a job but a short last one has the same table,
/// byte for byte, so a reader that keeps one cache per source parses and
/// allocates the table once instead of once per batch
/// ([`BatchView::parse_cached`]). Only bytes equal to ones that passed every
/// check are taken from it, with the same buffer length and table position,
/// which are all the table's checks depend on.
#[derive(Debug, Default)]
pub struct TableCache {
    /// The table's bytes, from its start to its end.
    raw: Vec<u8>,
    /// Where the table started (it follows the sample indices).
    table_start: usize,
    /// `tensor_count` of the header.
    tensor_count: usize,
    /// `total_len` of the batch.
    total_len: usize,
    /// What `raw` parsed to; `None` until a table was parsed.
    tensors: Option<Arc<[TensorInfo]>>,
}

impl TableCache {
    /// The cached table, if `rest` (the batch from `table_start` on) starts
    /// with the same bytes and the batch has the same length and count.
    fn hit(&self, rest: &[u8], table_start: usize, tensor_count: usize, total_len: usize) -> Option<Arc<[TensorInfo]>> {
        let tensors = self.tensors.as_ref()?;
        let same = self.table_start == table_start
            && self.tensor_count == tensor_count
            && self.total_len == total_len
            && rest.get(..self.raw.len()) == Some(&self.raw[..]);
        same.then(|| Arc::clone(tensors))
    }

    fn store(&mut self, raw: &[u8], table_start: usize, tensor_count: usize, total_len: usize, tensors: &Arc<[TensorInfo]>) {
        self.raw.clear();
        self.raw.extend_from_slice(raw);
        self.table_start = table_start;
        self.tensor_count = tensor_count;
        self.total_len = total_len;
        self.tensors = Some(Arc::clone(tensors));
    }
}

impl<'a> BatchView<'a> {
    /// Validates the header of the batch at the front of `buf`.
    pub fn parse(buf: &'a [u8]) -> Result<Self, BatchError> {
        Self::parse_inner(buf, None)
    }

    /// [`BatchView::parse`] for one of a stream of batches: a tensor table
    /// equal to the last one `cache` saw is not parsed again.
    pub fn parse_cached(buf: &'a [u8], cache: &mut TableCache) -> Result<Self, BatchError> {
        Self::parse_inner(buf, Some(cache))
    }

    fn parse_inner(buf: &'a [u8], cache: Option<&mut TableCache>) -> Result<Self, BatchError> {
        let total_len = checked_total_len(buf)?;
        // From here on only the batch's own bytes count.
        let r = Reader { buf: &buf[..total_len] };
        let meta = BatchMeta {
            job_id: r.u64(16, "job_id")?,
            seq: r.u64(24, "seq")?,
            epoch: r.u32(32, "epoch")?,
            consumer: r.u32(36, "consumer")?,
        };
        let sample_count = r.u32(40, "sample_count")? as usize;
        let tensor_count = r.u32(44, "tensor_count")? as usize;
        let table_offset = r.u64(48, "table_offset")?;
        if sample_count > MAX_SAMPLES {
            return invalid(format!("sample_count {sample_count} exceeds {MAX_SAMPLES}"));
        }
        if tensor_count > MAX_TENSORS {
            return invalid(format!("tensor_count {tensor_count} exceeds {MAX_TENSORS}"));
        }
        let expected_table = (FIXED_HEADER_LEN + 8 * sample_count) as u64;
        if table_offset != expected_table {
            return invalid(format!("table_offset {table_offset}, expected {expected_table}"));
        }
        let raw = r.bytes(FIXED_HEADER_LEN, 8 * sample_count, "sample indices")?;
        let indices = raw
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect();
        let table_start = expected_table as usize;
        if let Some(cache) = cache.as_deref() {
            let rest = r.buf.get(table_start..).unwrap_or_default();
            if let Some(tensors) = cache.hit(rest, table_start, tensor_count, total_len) {
                return Ok(Self { buf: &buf[..total_len], header: BatchHeader { meta, indices, tensors, total_len } });
            }
        }
        let (entries, table_end) = read_table(&r, table_start, tensor_count)?;
        if table_end > total_len {
            return Err(BatchError::Truncated { what: "tensor table", need: table_end as u64, have: total_len as u64 });
        }
        let tensors: Arc<[TensorInfo]> = place_payloads(entries, table_end, total_len)?.into();
        if let Some(cache) = cache {
            cache.store(&buf[table_start..table_end], table_start, tensor_count, total_len, &tensors);
        }
        Ok(Self { buf: &buf[..total_len], header: BatchHeader { meta, indices, tensors, total_len } })
    }

    /// The validated header.
    pub fn header(&self) -> &BatchHeader {
        &self.header
    }

    /// Takes the header, for a caller that keeps the buffer itself.
    pub fn into_header(self) -> BatchHeader {
        self.header
    }

    /// Payload bytes of tensor `i` (in table order).
    pub fn payload(&self, i: usize) -> Option<&'a [u8]> {
        let t = self.header.tensors.get(i)?;
        // In bounds: checked against this very buffer in `parse`.
        self.buf.get(t.offset..t.offset + t.len)
    }

    /// Payload bytes of the tensor called `name`.
    pub fn payload_by_name(&self, name: &str) -> Option<&'a [u8]> {
        let i = self.header.tensors.iter().position(|t| t.name == name)?;
        self.payload(i)
    }
}


/// The magic, version, flags and `total_len` of a batch's fixed header:
/// the length of the batch, which `buf` holds whole.
fn checked_total_len(buf: &[u8]) -> Result<usize, BatchError> {
    let r = Reader { buf };
    let magic: [u8; 4] = r.bytes(0, 4, "magic")?.try_into().expect("4 bytes");
    if magic != MAGIC {
        return Err(BatchError::BadMagic(magic));
    }
    r.bytes(0, FIXED_HEADER_LEN, "fixed header")?;
    let version = r.u16(4, "version")?;
    if version != VERSION {
        return Err(BatchError::UnsupportedVersion(version));
    }
    let flags = r.u16(6, "flags")?;
    if flags != 0 {
        return invalid(format!("unknown flags {flags:#x}"));
    }
    let total_len = r.u64(8, "total_len")?;
    if total_len > buf.len() as u64 {
        return Err(BatchError::Truncated { what: "batch", need: total_len, have: buf.len() as u64 });
    }
    Ok(total_len as usize)
}

/// One tensor's entry as the table states it: name, dtype, shape, payload
/// offset and length (checked against each other, not yet against the
/// batch).
type TableEntry = (String, Dtype, Vec<u64>, u64, u64);

/// The `tensor_count` entries of the tensor table at `at`, and where the
/// table ends.
fn read_table(r: &Reader<'_>, mut at: usize, tensor_count: usize) -> Result<(Vec<TableEntry>, usize), BatchError> {
    let mut tensors = Vec::with_capacity(tensor_count);
    for i in 0..tensor_count {
        let offset = r.u64(at, "tensor entry")?;
        let len = r.u64(at + 8, "tensor entry")?;
        let fixed = r.bytes(at + 16, 8, "tensor entry")?;
        let (code, ndim) = (fixed[0], fixed[1] as usize);
        let name_len = r.u16(at + 18, "tensor entry")? as usize;
        let Some(dtype) = Dtype::from_code(code) else {
            return invalid(format!("tensor {i}: unknown dtype code {code}"));
        };
        if ndim > MAX_NDIM {
            return invalid(format!("tensor {i}: {ndim} dims exceeds {MAX_NDIM}"));
        }
        if name_len == 0 {
            return invalid(format!("tensor {i}: empty name"));
        }
        let shape = (0..ndim)
            .map(|d| r.u64(at + 24 + 8 * d, "tensor shape"))
            .collect::<Result<Vec<_>, _>>()?;
        let name_bytes = r.bytes(at + 24 + 8 * ndim, name_len, "tensor name")?;
        let Ok(name) = std::str::from_utf8(name_bytes) else {
            return invalid(format!("tensor {i}: name is not UTF-8"));
        };
        let name = name.to_owned();
        at += entry_len(ndim, name_len);
        match tensor_bytes(dtype, &shape) {
            Some(l) if l == len => {}
            _ => {
                return invalid(format!(
                    "tensor {name:?}: length {len} does not match {} {:?}",
                    dtype.short_name(),
                    shape
                ));
            }
        }
        tensors.push((name, dtype, shape, offset, len));
    }
    Ok((tensors, at))
}

/// The table's entries placed in the batch: each payload aligned, between
/// the table's end and the batch's, named once, none overlapping another.
fn place_payloads(entries: Vec<TableEntry>, table_end: usize, total_len: usize) -> Result<Vec<TensorInfo>, BatchError> {
    let (table_end, total) = (table_end as u64, total_len as u64);
    let mut infos: Vec<TensorInfo> = Vec::with_capacity(entries.len());
    for (name, dtype, shape, offset, len) in entries {
        if offset % ALIGN as u64 != 0 {
            return invalid(format!("tensor {name:?}: offset {offset} is not {ALIGN}-byte aligned"));
        }
        let end = offset.checked_add(len);
        if offset < table_end || end.is_none_or(|e| e > total) {
            return invalid(format!("tensor {name:?}: payload {offset}+{len} lies outside {table_end}..{total_len}"));
        }
        if infos.iter().any(|t| t.name == name) {
            return invalid(format!("tensor {name:?} appears twice"));
        }
        infos.push(TensorInfo { name, dtype, shape, offset: offset as usize, len: len as usize });
    }
    let mut spans: Vec<(usize, usize)> = infos.iter().map(|t| (t.offset, t.offset + t.len)).collect();
    spans.sort_unstable();
    if spans.windows(2).any(|w| w[0].1 > w[1].0) {
        return invalid("tensor payloads overlap".into());
    }
    Ok(infos)
}

#[cfg(test)]
mod tests;
