//! [`BatchRows`]: the rows of one batch's tensors as a dataset fills them,
//! sample after sample, with the job's corrupt-sample policy applied as it
//! goes.
//!
//! A kept sample takes the next free row of every tensor; a sample left out
//! under `skip` gives its rows to the sample after it, so the kept samples
//! stay contiguous and the batch is one row shorter per skipped sample
//! (collate then rewrites the header for the samples actually held).
//! [`Dataset::read_batch`](super::Dataset::read_batch) drives it: by
//! default one `read_into` per sample; a dataset whose per-call cost
//! matters (a Python dataset: one interpreter call and GIL hold per batch
//! instead of per sample) reads the whole batch at once and settles each
//! sample here.

use loader_proto::pb::CorruptPolicy;

use super::DatasetError;

/// A sample left out of its batch under the `skip` policy.
#[derive(Debug)]
pub struct Skipped {
    /// Its dataset index.
    pub index: u64,
    /// Why: a [`DatasetError::Corrupt`] naming the file.
    pub error: DatasetError,
}

/// The rows of one batch being filled.
#[derive(Debug)]
pub struct BatchRows<'a> {
    /// Each tensor's payload: `capacity` rows of `row_len` bytes.
    payloads: Vec<&'a mut [u8]>,
    /// Bytes of one sample's row, per tensor.
    row_len: Vec<usize>,
    /// Rows each payload holds.
    capacity: usize,
    /// Dataset indices written, in row order.
    kept: Vec<u64>,
    /// Samples left out, in batch order.
    skipped: Vec<Skipped>,
    /// What a corrupt sample does.
    on_corrupt: CorruptPolicy,
    /// The dataset writes every byte of a row (a skipped sample's rows need
    /// no zeroing before the next sample takes them).
    whole_rows: bool,
}

impl<'a> BatchRows<'a> {
    /// Rows for `capacity` samples over `payloads` (one per tensor, each
    /// `capacity` rows long).
    pub fn new(
        payloads: Vec<&'a mut [u8]>,
        capacity: usize,
        on_corrupt: CorruptPolicy,
        whole_rows: bool,
    ) -> Self {
        let row_len = payloads.iter().map(|p| p.len() / capacity.max(1)).collect();
        Self {
            payloads,
            row_len,
            capacity,
            kept: Vec::with_capacity(capacity),
            skipped: Vec::new(),
            on_corrupt,
            whole_rows,
        }
    }

    /// The rows the next sample goes into, one per tensor: empty rows once
    /// every row holds a kept sample (a dataset that reads more samples than
    /// it was given keys for gets [`DatasetError::RowMismatch`] from
    /// [`check_rows`](super::check_rows) or its copy).
    pub fn next_rows(&mut self) -> Vec<&mut [u8]> {
        let at = self.kept.len();
        if at >= self.capacity {
            return self.payloads.iter_mut().map(|_| <&mut [u8]>::default()).collect();
        }
        self.payloads
            .iter_mut()
            .zip(&self.row_len)
            .map(|(p, &n)| &mut p[at * n..(at + 1) * n])
            .collect()
    }

    /// Records how reading sample `index` into [`next_rows`](Self::next_rows)
    /// went: kept; left out (a corrupt sample under `skip`: its rows go to
    /// the next sample); or the error that fails the batch.
    pub fn settle(&mut self, index: u64, read: Result<(), DatasetError>) -> Result<(), DatasetError> {
        match read {
            Ok(()) => {
                self.kept.push(index);
                Ok(())
            }
            Err(error @ DatasetError::Corrupt { .. }) if self.on_corrupt == CorruptPolicy::Skip => {
                if !self.whole_rows {
                    self.next_rows().iter_mut().for_each(|r| r.fill(0));
                }
                self.skipped.push(Skipped { index, error });
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Forgets every sample settled so far: the batch is read again from its
    /// first sample, into the same rows.
    pub fn reset(&mut self) {
        self.kept.clear();
        self.skipped.clear();
    }

    /// The indices kept, in row order, and the samples left out.
    pub fn finish(self) -> (Vec<u64>, Vec<Skipped>) {
        (self.kept, self.skipped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn corrupt(i: u64) -> DatasetError {
        DatasetError::Corrupt { path: format!("index {i}"), reason: "bad".into() }
    }

    #[test]
    fn skipped_rows_go_to_the_next_sample_and_extra_samples_get_no_rows() {
        let mut a = vec![0u8; 6];
        let mut b = vec![0u8; 3];
        let mut rows = BatchRows::new(vec![&mut a, &mut b], 3, CorruptPolicy::Skip, false);
        for (index, fill) in [(10u64, 1u8), (11, 2), (12, 3), (13, 4)] {
            let mut r = rows.next_rows();
            r.iter_mut().for_each(|row| row.fill(fill));
            let read = if index == 11 { Err(corrupt(index)) } else { Ok(()) };
            rows.settle(index, read).expect("skip");
        }
        let mut extra = rows.next_rows();
        assert!(extra.iter_mut().all(|r| r.is_empty()), "no row past the batch");
        let (kept, skipped) = rows.finish();
        assert_eq!(kept, vec![10, 12, 13]);
        assert_eq!(skipped.len(), 1);
        assert_eq!(skipped[0].index, 11);
        assert_eq!(a, [1, 1, 3, 3, 4, 4]);
        assert_eq!(b, [1, 3, 4]);
    }

    #[test]
    fn fail_policy_and_other_errors_end_the_batch() {
        let mut a = vec![0u8; 2];
        let mut rows = BatchRows::new(vec![&mut a], 2, CorruptPolicy::Fail, true);
        let e = rows.settle(5, Err(corrupt(5))).expect_err("fail policy");
        assert_eq!(e.to_string(), "corrupt sample index 5: bad");
        let mut rows = BatchRows::new(vec![], 2, CorruptPolicy::Skip, true);
        let e = rows.settle(9, Err(DatasetError::IndexOutOfRange { index: 9, len: 4 })).expect_err("not corrupt");
        assert!(e.to_string().contains("out of range"), "{e}");
    }
}
