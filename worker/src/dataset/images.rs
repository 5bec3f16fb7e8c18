//! What the image datasets share: the job's pipeline, which turns an
//! encoded JPEG/PNG into the `image` row, and the int64 `label` row next to
//! it (a scalar per sample, so the batch holds labels of shape `[B]`).

use loader_proto::pb::{Dtype, Transform};

use super::{DatasetError, SampleKey, SampleTensor, check_rows};
use crate::image::{ImageError, Pipeline};

/// The pipeline and the two tensors of an image sample.
#[derive(Debug)]
pub(super) struct ImageSamples {
    /// Decode and augment, deterministic given the sample key.
    pipeline: Pipeline,
    /// `image` (the pipeline's output) and `label` (int64 scalar).
    tensors: Vec<SampleTensor>,
    /// Bytes of the `image` and `label` rows.
    sizes: [usize; 2],
}

impl ImageSamples {
    /// Builds the pipeline of a `kind` dataset from the job's transforms.
    pub(super) fn new(kind: &'static str, transforms: &[Transform]) -> Result<Self, DatasetError> {
        let pipeline =
            Pipeline::new(transforms).map_err(|e| DatasetError::Spec(format!("{kind} dataset: {e}")))?;
        let (dtype, shape) = pipeline.output();
        let image = SampleTensor { name: "image".into(), dtype, shape: shape.to_vec() };
        let label = SampleTensor { name: "label".into(), dtype: Dtype::I64, shape: Vec::new() };
        let sizes = [pipeline.output_bytes(), 8];
        Ok(Self { pipeline, tensors: vec![image, label], sizes })
    }

    pub(super) fn tensors(&self) -> &[SampleTensor] {
        &self.tensors
    }

    /// Checks the rows handed in before any file is read.
    pub(super) fn check(&self, index: u64, rows: &[&mut [u8]]) -> Result<(), DatasetError> {
        check_rows(index, rows, &self.sizes)
    }

    /// Runs the pipeline on `encoded` into the image row and writes the
    /// label. An undecodable image is [`DatasetError::Corrupt`] naming
    /// `path` (built only on failure).
    pub(super) fn write(
        &self,
        key: SampleKey,
        encoded: &[u8],
        label: i64,
        path: impl FnOnce() -> String,
        rows: &mut [&mut [u8]],
    ) -> Result<(), DatasetError> {
        let [image, label_row] = rows else {
            return Err(DatasetError::RowMismatch { index: key.index });
        };
        run_pipeline(&self.pipeline, encoded, key, image, path)?;
        label_row.copy_from_slice(&label.to_le_bytes());
        Ok(())
    }
}

/// Runs `pipeline` on `encoded` into `row`. An undecodable image is
/// [`DatasetError::Corrupt`] naming `path` (built only on failure), for the
/// job's corrupt-sample policy; any other failure of the pipeline fails the
/// job.
pub(super) fn run_pipeline(
    pipeline: &Pipeline,
    encoded: &[u8],
    key: SampleKey,
    row: &mut [u8],
    path: impl FnOnce() -> String,
) -> Result<(), DatasetError> {
    match pipeline.run(encoded, key, row) {
        Ok(()) => Ok(()),
        Err(ImageError::Corrupt(reason)) => Err(DatasetError::Corrupt { path: path(), reason }),
        Err(other) => Err(DatasetError::Spec(format!("{}: {other}", path()))),
    }
}
