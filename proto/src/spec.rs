//! Validation of job specs, shared by every process that accepts one, so the
//! same bad spec gets the same one-line error everywhere.

use crate::batch::MAX_NAME_LEN;
use crate::mixture::{MixPlan, weight_units};
use crate::pb::{CorruptPolicy, DatasetSpec, Dtype, JobSpec, MixSpec, dataset_spec::Kind};
use crate::sampler::{MAX_DELIVERED, Plan, Resumed};
pub use crate::spec_error::SpecError;
use crate::spec_error::err;

/// Most data-parallel ranks (consumers) a job may have. The coordinator
/// keeps a delivery state per rank from the moment the job is submitted, so
/// an unchecked count is memory a single request can ask for (a fuzzed spec
/// with `consumers: 48888888` took the coordinator past 2 GiB). 65,536 is
/// more ranks than any data-parallel job runs with today.
pub const MAX_CONSUMERS: u32 = 1 << 16;

/// The dataset kinds a spec may name, for messages.
const KINDS: &str = "synthetic, tokens, image_folder, webdataset, npy, custom, mix";

/// Most sources one mixture lists.
pub const MAX_MIX_SOURCES: usize = 256;

/// What a worker does with a corrupt sample of this job (`fail` when unset).
pub fn corrupt_policy(spec: &JobSpec) -> CorruptPolicy {
    match CorruptPolicy::try_from(spec.on_corrupt) {
        Ok(CorruptPolicy::Skip) => CorruptPolicy::Skip,
        _ => CorruptPolicy::Fail,
    }
}

/// True for datasets whose samples are encoded images run through the
/// job's transforms (a mixture with such a source among its sources).
pub fn is_image_dataset(kind: &Kind) -> bool {
    match kind {
        Kind::ImageFolder(_) | Kind::Webdataset(_) => true,
        Kind::Mix(m) => m
            .sources
            .iter()
            .filter_map(|s| s.dataset.as_ref()?.kind.as_ref())
            .any(is_image_dataset),
        _ => false,
    }
}

/// Checks everything a submitter can check before reading any dataset file:
/// every field but the counts the submitter fills in from the files. A spec
/// file is checked with this right after it is parsed.
pub fn check(spec: &JobSpec) -> Result<(), SpecError> {
    let Some(kind) = spec.dataset.as_ref().and_then(|d| d.kind.as_ref()) else {
        return err("dataset", format!("missing; expected one of: {KINDS}"));
    };
    dataset_fields(kind)?;
    crate::blob::check_refs(spec)?;
    if spec.batch_size == 0 {
        return err("batch_size", "must be > 0");
    }
    if spec.batch_size as usize > crate::batch::MAX_SAMPLES {
        return err(
            "batch_size",
            format!(
                "{} exceeds the limit of {} samples per batch",
                spec.batch_size,
                crate::batch::MAX_SAMPLES
            ),
        );
    }
    if spec.epochs == 0 {
        return err("epochs", "must be > 0");
    }
    if spec.consumers == 0 {
        return err("consumers", "must be > 0");
    }
    if spec.consumers > MAX_CONSUMERS {
        return err(
            "consumers",
            format!(
                "{} exceeds the limit of {MAX_CONSUMERS} data-parallel ranks",
                spec.consumers
            ),
        );
    }
    if CorruptPolicy::try_from(spec.on_corrupt).is_err() {
        return err(
            "on_corrupt",
            format!(
                "unknown policy code {}; expected fail or skip",
                spec.on_corrupt
            ),
        );
    }
    if is_image_dataset(kind) {
        if spec.transforms.is_empty() {
            return err(
                "transforms",
                "an image dataset needs a pipeline, e.g. [decode, random_resized_crop 224, horizontal_flip]",
            );
        }
        crate::transforms::output(&spec.transforms)?;
    } else if !spec.transforms.is_empty() {
        return err(
            "transforms",
            format!(
                "only image datasets (image_folder, webdataset) take transforms, not {}",
                kind_name(kind)
            ),
        );
    }
    Ok(())
}

fn kind_name(kind: &Kind) -> &'static str {
    match kind {
        Kind::Synthetic(_) => "synthetic",
        Kind::Tokens(_) => "tokens",
        Kind::ImageFolder(_) => "image_folder",
        Kind::Webdataset(_) => "webdataset",
        Kind::Npy(_) => "npy",
        Kind::Custom(_) => "custom",
        Kind::Mix(_) => "mix",
    }
}

/// Checks a dataset's fields other than its counts.
fn dataset_fields(kind: &Kind) -> Result<(), SpecError> {
    match kind {
        Kind::Synthetic(s) => {
            if s.shape.is_empty() || s.shape.contains(&0) {
                return err(
                    "dataset.synthetic.shape",
                    format!("must be non-empty with no zero dims, got {:?}", s.shape),
                );
            }
            if matches!(Dtype::try_from(s.dtype), Ok(Dtype::Unspecified) | Err(_)) {
                return err("dataset.synthetic.dtype", "missing or unknown dtype");
            }
        }
        Kind::Tokens(t) => {
            if t.path.is_empty() {
                return err("dataset.tokens.path", "must name the token file");
            }
            if !matches!(Dtype::try_from(t.dtype), Ok(Dtype::U16 | Dtype::U32)) {
                return err("dataset.tokens.dtype", "must be uint16 or uint32");
            }
            if t.context_length == 0 {
                return err("dataset.tokens.context_length", "must be > 0");
            }
        }
        Kind::ImageFolder(f) => {
            if f.path.is_empty() {
                return err("dataset.image_folder.path", "must name the image folder");
            }
        }
        Kind::Webdataset(w) => {
            if w.shards.is_empty() {
                return err(
                    "dataset.webdataset.shards",
                    "must list at least one tar shard",
                );
            }
            if let Some(i) = w.shards.iter().position(String::is_empty) {
                return err(format!("dataset.webdataset.shards[{i}]"), "empty path");
            }
        }
        Kind::Npy(n) => {
            if n.arrays.is_empty() {
                return err("dataset.npy.arrays", "must name at least one array");
            }
            for (i, a) in n.arrays.iter().enumerate() {
                if a.name.is_empty() || a.name.len() > MAX_NAME_LEN {
                    return err(
                        format!("dataset.npy.arrays[{i}].name"),
                        format!("must be 1 to {MAX_NAME_LEN} bytes"),
                    );
                }
                if n.arrays[..i].iter().any(|b| b.name == a.name) {
                    return err(
                        format!("dataset.npy.arrays[{i}].name"),
                        format!("`{}` names two arrays", a.name),
                    );
                }
                if a.path.is_empty() {
                    return err(
                        format!("dataset.npy.arrays[{i}].path"),
                        "must name the .npy file",
                    );
                }
            }
        }
        Kind::Custom(c) => {
            if c.name.is_empty() {
                return err(
                    "dataset.custom.name",
                    "must name a dataset registered with the worker binary",
                );
            }
        }
        Kind::Mix(m) => mix_fields(m)?,
    }
    Ok(())
}

/// Checks a mixture's fields other than its counts.
fn mix_fields(m: &MixSpec) -> Result<(), SpecError> {
    if m.sources.is_empty() {
        return err("dataset.mix.sources", "must list at least one source");
    }
    if m.sources.len() > MAX_MIX_SOURCES {
        return err(
            "dataset.mix.sources",
            format!(
                "{} sources exceed the limit of {MAX_MIX_SOURCES}",
                m.sources.len()
            ),
        );
    }
    for (i, source) in m.sources.iter().enumerate() {
        let at = format!("dataset.mix.sources[{i}]");
        if source.name.is_empty() || source.name.len() > MAX_NAME_LEN {
            return err(
                format!("{at}.name"),
                format!("must be 1 to {MAX_NAME_LEN} bytes"),
            );
        }
        if m.sources[..i].iter().any(|o| o.name == source.name) {
            return err(
                format!("{at}.name"),
                format!("`{}` names two sources", source.name),
            );
        }
        if !source.weight.is_finite() || source.weight < 0.0 {
            return err(
                format!("{at}.weight"),
                format!("must be a finite number >= 0, got {}", source.weight),
            );
        }
        let Some(kind) = source.dataset.as_ref().and_then(|d| d.kind.as_ref()) else {
            return err(
                format!("{at}.dataset"),
                format!("missing; expected one of: {KINDS}"),
            );
        };
        if matches!(kind, Kind::Mix(_)) {
            return err(
                format!("{at}.dataset"),
                "a mixture cannot hold a mixture; list its sources here instead",
            );
        }
        dataset_fields(kind).map_err(|e| nested(e, &at))?;
    }
    let weights: Vec<f64> = m.sources.iter().map(|s| s.weight).collect();
    weight_units(&weights).map_err(|e| SpecError {
        field: "dataset.mix.sources".into(),
        problem: format!("weights: {e}"),
    })?;
    if m.source_field.len() > MAX_NAME_LEN {
        return err(
            "dataset.mix.source_field",
            format!("must be at most {MAX_NAME_LEN} bytes"),
        );
    }
    for (i, stage) in m.stages.iter().enumerate() {
        let at = format!("dataset.mix.stages[{i}]");
        if stage.weights.len() != m.sources.len() {
            return err(
                format!("{at}.weights"),
                format!(
                    "gives {} weights for {} sources",
                    stage.weights.len(),
                    m.sources.len()
                ),
            );
        }
        weight_units(&stage.weights).map_err(|e| SpecError {
            field: format!("{at}.weights"),
            problem: e.to_string(),
        })?;
        let after = if i == 0 {
            stage.start == 0
        } else {
            stage.start > m.stages[i - 1].start
        };
        if !after {
            return err(
                format!("{at}.start"),
                "the first stage starts at 0, each later one after the one before",
            );
        }
    }
    match m.stages.last() {
        None if m.weights_from != 0 => err(
            "dataset.mix.weights_from",
            "must be 0 without earlier stages",
        ),
        Some(last) if m.weights_from <= last.start => err(
            "dataset.mix.weights_from",
            format!("must be after the last stage's start {}", last.start),
        ),
        _ => Ok(()),
    }
}

/// A source's error, its field named from the mixture down.
fn nested(e: SpecError, at: &str) -> SpecError {
    let field = match e.field.strip_prefix("dataset") {
        Some(rest) => format!("{at}.dataset{rest}"),
        None => e.field,
    };
    SpecError {
        field,
        problem: e.problem,
    }
}

/// Samples of each source of a mixture, from the spec alone.
pub fn mix_source_sizes(m: &MixSpec) -> Result<Vec<u64>, SpecError> {
    m.sources
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let at = format!("dataset.mix.sources[{i}]");
            match &s.dataset {
                Some(d) => num_samples(d).map_err(|e| nested(e, &at)),
                None => err(
                    format!("{at}.dataset"),
                    format!("missing; expected one of: {KINDS}"),
                ),
            }
        })
        .collect()
}

/// The mixture's default epoch: positions until the source with the
/// largest weight has been drawn once whole (the first such source when
/// weights tie).
pub fn mix_default_epoch(m: &MixSpec) -> Result<u64, SpecError> {
    let sizes = mix_source_sizes(m)?;
    let weights: Vec<f64> = m.sources.iter().map(|s| s.weight).collect();
    let units = weight_units(&weights).map_err(|e| SpecError {
        field: "dataset.mix.sources".into(),
        problem: format!("weights: {e}"),
    })?;
    let total: u64 = units.iter().sum();
    let (k, _) = units.iter().enumerate().fold(
        (0, 0),
        |best, (k, &u)| if u > best.1 { (k, u) } else { best },
    );
    let epoch = (u128::from(sizes[k]) * u128::from(total)).div_ceil(u128::from(units[k].max(1)));
    u64::try_from(epoch).or_else(|_| {
        err(
            "dataset.mix.samples_per_epoch",
            "the default epoch overflows; give one",
        )
    })
}

/// The mixture of a spec's dataset, if it is one: what every process
/// draws each position of its stream from.
pub fn mix_plan(spec: &JobSpec) -> Result<Option<MixPlan>, SpecError> {
    let Some(Kind::Mix(m)) = spec.dataset.as_ref().and_then(|d| d.kind.as_ref()) else {
        return Ok(None);
    };
    let block = match m.block {
        0 => u64::from(spec.batch_size) * u64::from(spec.consumers.max(1)),
        b => b,
    };
    let sizes = mix_source_sizes(m)?;
    let mut stages: Vec<(u64, Vec<f64>)> = m
        .stages
        .iter()
        .map(|s| (s.start, s.weights.clone()))
        .collect();
    stages.push((m.weights_from, m.sources.iter().map(|s| s.weight).collect()));
    let sampler = spec.sampler.unwrap_or_default();
    MixPlan::new(&sizes, &stages, block, sampler.seed, sampler.shuffle)
        .map(Some)
        .map_err(|e| SpecError {
            field: "dataset.mix".into(),
            problem: e.to_string(),
        })
}

/// Number of samples of a dataset, from the spec alone.
pub fn num_samples(dataset: &DatasetSpec) -> Result<u64, SpecError> {
    let Some(kind) = &dataset.kind else {
        return err("dataset", format!("missing; expected one of: {KINDS}"));
    };
    dataset_fields(kind)?;
    let filled = |field: &str, what: &str| {
        err(
            field,
            format!("is 0; the submitter fills it in by {what} (the SDK's spec builders do)"),
        )
    };
    match kind {
        Kind::Synthetic(s) => {
            if s.num_samples == 0 {
                return err("dataset.synthetic.num_samples", "must be > 0");
            }
            Ok(s.num_samples)
        }
        Kind::Tokens(t) => {
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
        Kind::ImageFolder(f) => {
            if f.num_samples == 0 {
                return filled("dataset.image_folder.num_samples", "listing the folder");
            }
            Ok(f.num_samples)
        }
        Kind::Webdataset(w) => {
            if w.shard_samples.len() != w.shards.len() {
                return err(
                    "dataset.webdataset.shard_samples",
                    format!(
                        "has {} counts for {} shards; the submitter fills it in by indexing the shards",
                        w.shard_samples.len(),
                        w.shards.len()
                    ),
                );
            }
            let total = w
                .shard_samples
                .iter()
                .try_fold(0u64, |acc, &n| acc.checked_add(n));
            match total {
                Some(0) => err(
                    "dataset.webdataset.shard_samples",
                    "the shards hold no sample",
                ),
                Some(n) => Ok(n),
                None => err("dataset.webdataset.shard_samples", "sample counts overflow"),
            }
        }
        Kind::Npy(n) => {
            if n.num_samples == 0 {
                return filled("dataset.npy.num_samples", "reading the arrays' headers");
            }
            Ok(n.num_samples)
        }
        Kind::Custom(c) => {
            if c.num_samples == 0 {
                return err("dataset.custom.num_samples", "must be > 0");
            }
            Ok(c.num_samples)
        }
        Kind::Mix(m) => {
            mix_source_sizes(m)?;
            if m.samples_per_epoch == 0 {
                return filled(
                    "dataset.mix.samples_per_epoch",
                    "from the sources' sizes and weights",
                );
            }
            Ok(m.samples_per_epoch)
        }
    }
}

/// The `resume` field of a spec over `num_samples` samples, checked: what
/// a resumed job's plan is built from (see `crate::elastic`).
fn resumed_epoch(spec: &JobSpec, num_samples: u64) -> Result<Option<Resumed>, SpecError> {
    let Some(r) = &spec.resume else {
        return Ok(None);
    };
    if r.epoch >= spec.epochs {
        return err(
            "resume.epoch",
            format!("{} is outside the job's {} epochs", r.epoch, spec.epochs),
        );
    }
    if r.offset > num_samples {
        return err(
            "resume.offset",
            format!("{} is past the epoch's {num_samples} samples", r.offset),
        );
    }
    if r.delivered.len() > MAX_DELIVERED {
        return err(
            "resume.delivered",
            format!(
                "lists {} positions, more than {MAX_DELIVERED}",
                r.delivered.len()
            ),
        );
    }
    let mut above = r.offset;
    for &d in &r.delivered {
        if d <= above || d >= num_samples {
            return err(
                "resume.delivered",
                format!(
                    "positions must ascend, each above the offset {} and below {num_samples}",
                    r.offset
                ),
            );
        }
        above = d;
    }
    Ok(Some(Resumed {
        epoch: r.epoch,
        offset: r.offset,
        delivered: r.delivered.clone(),
    }))
}

/// Validates a job spec and returns its plan.
pub fn plan(spec: &JobSpec) -> Result<Plan, SpecError> {
    check(spec)?;
    crate::blob::check_filled(spec)?;
    let Some(dataset) = &spec.dataset else {
        return err("dataset", format!("missing; expected one of: {KINDS}"));
    };
    let num_samples = num_samples(dataset)?;
    let sampler = spec.sampler.unwrap_or_default();
    let shards = match &dataset.kind {
        Some(Kind::Webdataset(w)) => Some(w.shard_samples.as_slice().into()),
        _ => None,
    };
    let resume = resumed_epoch(spec, num_samples)?;
    // A mixture shuffles itself (per block, per source): the plan keeps
    // the stream's order, so index = position in the epoch.
    let mixed = mix_plan(spec)?.is_some();
    let plan = Plan {
        num_samples,
        batch_size: u64::from(spec.batch_size),
        consumers: spec.consumers,
        shuffle: sampler.shuffle && !mixed,
        seed: sampler.seed,
        drop_last: sampler.drop_last,
        epochs: spec.epochs,
        shards,
        resume: resume.map(std::sync::Arc::new),
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
    use crate::pb::{
        CustomSpec, Decode, ImageFolderSpec, NpyArray, NpySpec, RandomResizedCrop, SyntheticSpec,
        TokensSpec, Transform, WebDatasetSpec, transform::Op,
    };

    fn synthetic() -> JobSpec {
        JobSpec {
            dataset: Some(DatasetSpec {
                kind: Some(Kind::Synthetic(SyntheticSpec {
                    num_samples: 100,
                    shape: vec![4],
                    dtype: Dtype::U8 as i32,
                    cost_ns: 0,
                    wait_ns_by_epoch: Vec::new(),
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
            (
                "batch_size",
                JobSpec {
                    batch_size: 0,
                    ..synthetic()
                },
            ),
            (
                "batch_size",
                JobSpec {
                    batch_size: u32::MAX,
                    ..synthetic()
                },
            ),
            (
                "epochs",
                JobSpec {
                    epochs: 0,
                    ..synthetic()
                },
            ),
            (
                "consumers",
                JobSpec {
                    consumers: 0,
                    ..synthetic()
                },
            ),
            (
                "consumers",
                JobSpec {
                    consumers: MAX_CONSUMERS + 1,
                    ..synthetic()
                },
            ),
            (
                "dataset",
                JobSpec {
                    dataset: None,
                    ..synthetic()
                },
            ),
            (
                "dataset.tokens.context_length",
                JobSpec {
                    dataset: Some(DatasetSpec {
                        kind: Some(Kind::Tokens(TokensSpec {
                            path: "x".into(),
                            dtype: Dtype::U16 as i32,
                            context_length: 0,
                            num_tokens: 10,
                        })),
                    }),
                    ..synthetic()
                },
            ),
        ];
        for (field, spec) in cases {
            let e = plan(&spec).expect_err(field);
            assert_eq!(e.field, field);
            assert!(e.to_string().starts_with("invalid job spec: "));
        }
    }

    #[test]
    fn a_resume_that_cannot_be_true_names_its_field() {
        use crate::pb::EpochResume;
        let resumed = |epoch, offset, delivered: Vec<u64>| JobSpec {
            epochs: 2,
            resume: Some(EpochResume {
                epoch,
                offset,
                delivered,
            }),
            ..synthetic()
        };
        let good = plan(&resumed(1, 40, vec![41, 50])).expect("a resumed plan");
        assert_eq!(
            (
                good.first_epoch(),
                good.resumed(1).map(|r| r.remaining(100))
            ),
            (1, Some(58))
        );
        let cases = [
            ("resume.epoch", resumed(2, 0, vec![])),
            ("resume.offset", resumed(0, 101, vec![])),
            ("resume.delivered", resumed(0, 10, vec![10])),
            ("resume.delivered", resumed(0, 10, vec![20, 15])),
            ("resume.delivered", resumed(0, 10, vec![100])),
            (
                "resume.delivered",
                resumed(0, 0, (1..=MAX_DELIVERED as u64 + 1).collect()),
            ),
        ];
        for (field, spec) in cases {
            let e = plan(&spec).expect_err(field);
            assert_eq!(e.field, field, "{e}");
            assert!(!e.to_string().contains('\n'));
        }
    }

    fn with(kind: Kind, transforms: Vec<Transform>) -> JobSpec {
        JobSpec {
            dataset: Some(DatasetSpec { kind: Some(kind) }),
            transforms,
            ..synthetic()
        }
    }

    fn train() -> Vec<Transform> {
        let crop = RandomResizedCrop {
            size: vec![224],
            scale: vec![],
            ratio: vec![],
        };
        vec![
            Transform {
                op: Some(Op::Decode(Decode {})),
            },
            Transform {
                op: Some(Op::RandomResizedCrop(crop)),
            },
        ]
    }

    fn folder(num_samples: u64) -> Kind {
        Kind::ImageFolder(ImageFolderSpec {
            path: "/data/train".into(),
            num_samples,
            ..Default::default()
        })
    }

    fn npy(names: &[&str]) -> Kind {
        let arrays = names
            .iter()
            .map(|n| NpyArray {
                name: (*n).into(),
                path: format!("/d/{n}.npy"),
            })
            .collect();
        Kind::Npy(NpySpec {
            arrays,
            num_samples: 10,
        })
    }

    #[test]
    fn the_new_datasets_plan_and_shards_order_the_webdataset() {
        assert_eq!(
            plan(&with(folder(100), train()))
                .expect("image folder")
                .num_samples,
            100
        );
        let wds = Kind::Webdataset(WebDatasetSpec {
            shards: vec!["a.tar".into(), "b.tar".into()],
            shard_samples: vec![3, 4],
        });
        let p = plan(&with(wds, train())).expect("webdataset");
        assert_eq!(
            (p.num_samples, p.shards.as_deref()),
            (7, Some(&[3u64, 4][..]))
        );
        assert_eq!(
            plan(&with(npy(&["x", "y"]), vec![]))
                .expect("npy")
                .num_samples,
            10
        );
        assert_eq!(plan(&synthetic()).expect("synthetic").shards, None);
    }

    #[test]
    fn bad_dataset_and_pipeline_fields_are_named() {
        let wds = |shards: Vec<&str>, counts: Vec<u64>| {
            Kind::Webdataset(WebDatasetSpec {
                shards: shards.into_iter().map(Into::into).collect(),
                shard_samples: counts,
            })
        };
        let custom = |name: &str, n| {
            Kind::Custom(CustomSpec {
                name: name.into(),
                num_samples: n,
                ..Default::default()
            })
        };
        let cases: Vec<(&str, &str, JobSpec)> = vec![
            (
                "dataset.image_folder.path",
                "must name the image folder",
                with(Kind::ImageFolder(ImageFolderSpec::default()), train()),
            ),
            (
                "dataset.image_folder.num_samples",
                "is 0; the submitter fills it in by listing the folder",
                with(folder(0), train()),
            ),
            (
                "transforms",
                "an image dataset needs a pipeline",
                with(folder(5), vec![]),
            ),
            (
                "transforms",
                "only image datasets (image_folder, webdataset) take transforms, not npy",
                with(npy(&["x"]), train()),
            ),
            (
                "transforms",
                "only image datasets (image_folder, webdataset) take transforms, not synthetic",
                JobSpec {
                    transforms: train(),
                    ..synthetic()
                },
            ),
            (
                "dataset.webdataset.shards",
                "must list at least one tar shard",
                with(wds(vec![], vec![]), train()),
            ),
            (
                "dataset.webdataset.shards[1]",
                "empty path",
                with(wds(vec!["a.tar", ""], vec![1, 1]), train()),
            ),
            (
                "dataset.webdataset.shard_samples",
                "has 1 counts for 2 shards",
                with(wds(vec!["a.tar", "b.tar"], vec![4]), train()),
            ),
            (
                "dataset.webdataset.shard_samples",
                "the shards hold no sample",
                with(wds(vec!["a.tar"], vec![0]), train()),
            ),
            (
                "dataset.npy.arrays",
                "must name at least one array",
                with(npy(&[]), vec![]),
            ),
            (
                "dataset.npy.arrays[1].name",
                "`x` names two arrays",
                with(npy(&["x", "x"]), vec![]),
            ),
            (
                "dataset.npy.arrays[0].name",
                "must be 1 to 255 bytes",
                with(npy(&[""]), vec![]),
            ),
            (
                "dataset.custom.name",
                "must name a dataset registered",
                with(custom("", 3), vec![]),
            ),
            (
                "dataset.custom.num_samples",
                "must be > 0",
                with(custom("mine", 0), vec![]),
            ),
            (
                "on_corrupt",
                "unknown policy code 9; expected fail or skip",
                JobSpec {
                    on_corrupt: 9,
                    ..synthetic()
                },
            ),
        ];
        for (field, problem, spec) in cases {
            let e = plan(&spec).expect_err(field);
            assert_eq!(e.field, field, "{e}");
            assert!(e.problem.starts_with(problem), "{field}: {e}");
            assert!(!e.to_string().contains('\n'));
        }
    }
}
