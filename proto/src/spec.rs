//! Validation of job specs, shared by every process that accepts one, so the
//! same bad spec gets the same one-line error everywhere.

use crate::pb::{Dtype, DatasetSpec, JobSpec, dataset_spec::Kind};
use crate::sampler::Plan;

/// A job spec field that holds an impossible value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid job spec: {field}: {problem}")]
pub struct SpecError {
    /// Dotted path of the field, e.g. `batch_size`, `dataset.tokens.path` or
    /// `transforms[1].random_resized_crop.size`.
    pub field: String,
    /// What was wrong and what was expected.
    pub problem: String,
}

fn err<T>(field: impl Into<String>, problem: impl Into<String>) -> Result<T, SpecError> {
    Err(SpecError { field: field.into(), problem: problem.into() })
}

/// Number of samples of a dataset, from the spec alone.
pub fn num_samples(dataset: &DatasetSpec) -> Result<u64, SpecError> {
    match &dataset.kind {
        None => err("dataset", "missing; expected one of: synthetic, tokens"),
        Some(Kind::Synthetic(s)) => {
            if s.num_samples == 0 {
                return err("dataset.synthetic.num_samples", "must be > 0");
            }
            if s.shape.is_empty() || s.shape.contains(&0) {
                return err("dataset.synthetic.shape", format!("must be non-empty with no zero dims, got {:?}", s.shape));
            }
            if matches!(Dtype::try_from(s.dtype), Ok(Dtype::Unspecified) | Err(_)) {
                return err("dataset.synthetic.dtype", "missing or unknown dtype");
            }
            Ok(s.num_samples)
        }
        Some(Kind::Tokens(t)) => {
            if t.path.is_empty() {
                return err("dataset.tokens.path", "must name the token file");
            }
            if !matches!(Dtype::try_from(t.dtype), Ok(Dtype::U16 | Dtype::U32)) {
                return err("dataset.tokens.dtype", "must be uint16 or uint32");
            }
            if t.context_length == 0 {
                return err("dataset.tokens.context_length", "must be > 0");
            }
            if t.num_tokens <= t.context_length {
                return err(
                    "dataset.tokens.num_tokens",
                    format!(
                        "{} tokens cannot fill one window of {} + 1 ids",
                        t.num_tokens, t.context_length
                    ),
                );
            }
            Ok((t.num_tokens - 1) / t.context_length)
        }
        Some(Kind::ImageFolder(_) | Kind::Webdataset(_) | Kind::Npy(_)) => {
            err("dataset", "image_folder, webdataset and npy are not implemented yet (issue 5)")
        }
    }
}

/// Validates a job spec and returns its plan.
pub fn plan(spec: &JobSpec) -> Result<Plan, SpecError> {
    let dataset = match &spec.dataset {
        Some(d) => d,
        None => return err("dataset", "missing; expected one of: synthetic, tokens"),
    };
    let num_samples = num_samples(dataset)?;
    if spec.batch_size == 0 {
        return err("batch_size", "must be > 0");
    }
    if spec.epochs == 0 {
        return err("epochs", "must be > 0");
    }
    if spec.consumers == 0 {
        return err("consumers", "must be > 0");
    }
    let sampler = spec.sampler.unwrap_or_default();
    let plan = Plan {
        num_samples,
        batch_size: u64::from(spec.batch_size),
        consumers: spec.consumers,
        shuffle: sampler.shuffle,
        seed: sampler.seed,
        drop_last: sampler.drop_last,
        epochs: spec.epochs,
    };
    if plan.batches_per_epoch() == 0 {
        return err(
            "batch_size",
            format!(
                "{} samples over {} consumers with drop_last leave no full batch of {}",
                num_samples, spec.consumers, spec.batch_size
            ),
        );
    }
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::{SyntheticSpec, TokensSpec};

    fn synthetic() -> JobSpec {
        JobSpec {
            dataset: Some(DatasetSpec {
                kind: Some(Kind::Synthetic(SyntheticSpec {
                    num_samples: 100,
                    shape: vec![4],
                    dtype: Dtype::U8 as i32,
                    cost_ns: 0,
                })),
            }),
            batch_size: 8,
            epochs: 1,
            consumers: 1,
            ..Default::default()
        }
    }

    #[test]
    fn good_spec_plans() {
        assert_eq!(plan(&synthetic()).expect("plan").batches_per_epoch(), 13);
    }

    #[test]
    fn bad_specs_name_the_field() {
        let cases: Vec<(&str, JobSpec)> = vec![
            ("batch_size", JobSpec { batch_size: 0, ..synthetic() }),
            ("epochs", JobSpec { epochs: 0, ..synthetic() }),
            ("consumers", JobSpec { consumers: 0, ..synthetic() }),
            ("dataset", JobSpec { dataset: None, ..synthetic() }),
            ("dataset.tokens.context_length", JobSpec {
                dataset: Some(DatasetSpec {
                    kind: Some(Kind::Tokens(TokensSpec {
                        path: "x".into(),
                        dtype: Dtype::U16 as i32,
                        context_length: 0,
                        num_tokens: 10,
                    })),
                }),
                ..synthetic()
            }),
        ];
        for (field, spec) in cases {
            let e = plan(&spec).expect_err(field);
            assert_eq!(e.field, field);
            assert!(e.to_string().starts_with("invalid job spec: "));
        }
    }
}
