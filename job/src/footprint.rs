//! How many bytes one full batch of a job takes, told from its spec before
//! any batch exists: the trainer sizes its ring and prefetch window by it
//! (see [`crate::window`]), and the coordinator refuses a job whose batches
//! cannot fit its workers' memory (a valid but enormous shape must fail its
//! submitter with one line, not take down every worker it reaches).
//!
//! An upper bound with a small margin for the header, not the layout itself:
//! the layout belongs to the worker that writes the batch. The npy dataset's
//! row shapes live in its files, so its callers say how to read them; a
//! dataset only a custom worker knows has no estimate.

use loader_proto::batch::{ALIGN, FIXED_HEADER_LEN, MAX_ENTRY_LEN, tensor_bytes};
use loader_proto::pb::{Dtype, JobSpec, NpyArray, dataset_spec::Kind};

/// Bytes of the int64 label the image and synthetic datasets add per sample.
const LABEL: u64 = 8;

/// Upper bound on what one tensor adds beside its payload: its table entry
/// and the padding (under [`ALIGN`] bytes) that aligns its payload.
const PER_TENSOR: u64 = (MAX_ENTRY_LEN + ALIGN) as u64;

/// Upper bound on the bytes of one full batch of `spec`, for the kinds a
/// spec describes alone (not npy, whose shapes are in its files, nor custom).
pub fn batch_bytes(spec: &JobSpec) -> Option<u64> {
    batch_bytes_with(spec, |_| None)
}

/// [`batch_bytes`], with `npy_row` telling the bytes of one row of an npy
/// array (from its header).
pub fn batch_bytes_with(spec: &JobSpec, npy_row: impl Fn(&NpyArray) -> Option<u64>) -> Option<u64> {
    let kind = spec.dataset.as_ref()?.kind.as_ref()?;
    let (per_sample, tensors) = sample_bytes(kind, &spec.transforms, &npy_row)?;
    let batch = u64::from(spec.batch_size);
    let header = (FIXED_HEADER_LEN as u64).checked_add(batch.checked_mul(8)?)?.checked_add(PER_TENSOR * tensors)?;
    per_sample.checked_mul(batch)?.checked_add(header)
}

/// Bytes of one sample and the number of tensors it has.
fn sample_bytes(
    kind: &Kind,
    transforms: &[loader_proto::pb::Transform],
    npy_row: &impl Fn(&NpyArray) -> Option<u64>,
) -> Option<(u64, u64)> {
    match kind {
        Kind::Synthetic(s) => {
            let dtype = Dtype::try_from(s.dtype).ok()?;
            Some((tensor_bytes(dtype, &s.shape)?.checked_add(LABEL)?, 2))
        }
        Kind::Tokens(t) => {
            let dtype = Dtype::try_from(t.dtype).ok()?;
            Some((tensor_bytes(dtype, &[t.context_length.checked_add(1)?])?, 1))
        }
        Kind::ImageFolder(_) | Kind::Webdataset(_) => {
            let (dtype, shape) = crate::transforms::output(transforms).ok()?;
            Some((tensor_bytes(dtype, &shape)?.checked_add(LABEL)?, 2))
        }
        Kind::Npy(n) => {
            let mut total = 0u64;
            for a in &n.arrays {
                total = total.checked_add(npy_row(a)?)?;
            }
            Some((total, n.arrays.len() as u64))
        }
        Kind::Parquet(p) => {
            let mut total = p.row_bytes.iter().try_fold(0u64, |acc, &b| acc.checked_add(b))?;
            let mut tensors = p.row_bytes.len() as u64;
            if !p.image_column.is_empty() {
                let (dtype, shape) = crate::transforms::output(transforms).ok()?;
                total = total.checked_add(tensor_bytes(dtype, &shape)?)?;
                tensors += 1;
            }
            Some((total, tensors))
        }
        Kind::Custom(_) => None,
        // Every source's samples collate together: the largest bounds
        // them all, plus the int64 source index when asked for.
        Kind::Mix(m) => {
            let mut most = (0u64, 0u64);
            for source in &m.sources {
                let kind = source.dataset.as_ref()?.kind.as_ref()?;
                if matches!(kind, Kind::Mix(_)) {
                    return None;
                }
                let (bytes, tensors) = sample_bytes(kind, transforms, npy_row)?;
                most = (most.0.max(bytes), most.1.max(tensors));
            }
            let field = u64::from(!m.source_field.is_empty());
            Some((most.0.checked_add(LABEL * field)?, most.1 + field))
        }
    }
}

/// Bytes as a person reads them: `40.0 GB`, `9.6 MB`, `4.2 kB`.
pub fn human_bytes(n: u64) -> String {
    let n = n as f64;
    match n {
        n if n >= 1e9 => format!("{:.1} GB", n / 1e9),
        n if n >= 1e6 => format!("{:.1} MB", n / 1e6),
        n if n >= 1e3 => format!("{:.1} kB", n / 1e3),
        n => format!("{n} bytes"),
    }
}

#[cfg(test)]
mod tests {
    use loader_proto::batch::{BatchLayout, TensorDesc};
    use loader_proto::pb::{DatasetSpec, SyntheticSpec, TokensSpec};

    use super::*;

    fn spec(kind: Kind, batch_size: u32) -> JobSpec {
        JobSpec { dataset: Some(DatasetSpec { kind: Some(kind) }), batch_size, epochs: 1, consumers: 1, ..Default::default() }
    }

    /// The estimate bounds the real layout from above, with little slack.
    #[test]
    fn bounds_the_layout_of_a_synthetic_and_a_token_batch() {
        let synthetic = spec(
            Kind::Synthetic(SyntheticSpec { num_samples: 1000, shape: vec![3, 32, 32], dtype: Dtype::U8 as i32, cost_ns: 0, wait_ns_by_epoch: Vec::new() }),
            64,
        );
        let real = BatchLayout::new(
            64,
            vec![
                TensorDesc { name: "data".into(), dtype: Dtype::U8, shape: vec![64, 3, 32, 32] },
                TensorDesc { name: "label".into(), dtype: Dtype::I64, shape: vec![64] },
            ],
        )
        .expect("layout")
        .total_len() as u64;
        let estimate = batch_bytes(&synthetic).expect("known");
        assert!(estimate >= real && estimate < real + 2048, "{estimate} vs {real}");

        let tokens = spec(
            Kind::Tokens(TokensSpec { path: "unused".into(), dtype: Dtype::U16 as i32, context_length: 2048, num_tokens: 1 << 20 }),
            1,
        );
        let real = BatchLayout::new(1, vec![TensorDesc { name: "tokens".into(), dtype: Dtype::U16, shape: vec![1, 2049] }])
            .expect("layout")
            .total_len() as u64;
        let estimate = batch_bytes(&tokens).expect("known");
        assert!(estimate >= real && estimate < real + 1024, "{estimate} vs {real}");
    }

    #[test]
    fn huge_shapes_are_counted_and_overflow_is_none() {
        let huge = spec(
            Kind::Synthetic(SyntheticSpec { num_samples: 16, shape: vec![100_000, 100_000], dtype: Dtype::U8 as i32, cost_ns: 0, wait_ns_by_epoch: Vec::new() }),
            4,
        );
        assert!(batch_bytes(&huge).expect("counted") >= 40_000_000_000);
        let overflow = spec(
            Kind::Synthetic(SyntheticSpec { num_samples: 16, shape: vec![u64::MAX / 2, 4], dtype: Dtype::U8 as i32, cost_ns: 0, wait_ns_by_epoch: Vec::new() }),
            4,
        );
        assert_eq!(batch_bytes(&overflow), None);
        assert_eq!(human_bytes(40_000_000_224), "40.0 GB");
        assert_eq!(human_bytes(512), "512 bytes");
    }
}
