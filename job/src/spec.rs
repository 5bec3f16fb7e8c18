//! Validation of job specs, shared by every process that accepts one, so the
//! same bad spec gets the same one-line error everywhere.

//!
//! # Layout
//! - this module: the checks of a whole spec ([`check`], [`plan`]): name,
//!   batch, consumers, sampler, shared stream, resume, transforms.
//! - `dataset`: each dataset kind's fields and its sample count, mixtures
//!   among them ([`num_samples`], [`mix_plan`]).

mod dataset;

use loader_proto::batch::MAX_NAME_LEN;
use loader_proto::pb::{CorruptPolicy, JobSpec, dataset_spec::Kind};
use crate::sampler::{MAX_DELIVERED, Plan, Resumed};
pub use crate::error::SpecError;
use crate::error::err;
pub use dataset::{MAX_MIX_SOURCES, mix_default_epoch, mix_plan, mix_source_sizes, num_samples};
use dataset::{KINDS, dataset_fields, kind_name, kind_name_of};

/// How many consumed batches a subscriber of a shared stream may trail the
/// one furthest ahead and still share its batches, when the spec's
/// `shared.max_lag` is 0. Large: trainers started a second apart differ
/// by tens of batches, and one left out of the shared ranges pays for
/// every batch again; what a slow subscriber holds on a worker is bounded
/// by its window, not by this.
pub const DEFAULT_SHARED_MAX_LAG: u32 = 1024;

/// Most data-parallel ranks (consumers) a job may have. The coordinator
/// keeps a delivery state per rank from the moment the job is submitted, so
/// an unchecked count is memory a single request can ask for (a fuzzed spec
/// with `consumers: 48888888` took the coordinator past 2 GiB). 65,536 is
/// more ranks than any data-parallel job runs with today.
pub const MAX_CONSUMERS: u32 = 1 << 16;

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
        Kind::Parquet(p) => !p.image_column.is_empty(),
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
    // First: a name is kept (and logged) for the job's life, so a huge one
    // is refused before anything else looks at the spec.
    if spec.name.len() > MAX_NAME_LEN {
        return err(
            "name",
            format!("{} bytes is longer than the {MAX_NAME_LEN} a job name may have", spec.name.len()),
        );
    }
    let Some(kind) = spec.dataset.as_ref().and_then(|d| d.kind.as_ref()) else {
        return err("dataset", format!("missing; expected one of: {KINDS}"));
    };
    dataset_fields(kind)?;
    dataset::no_worker_fields(kind)?;
    crate::blob_refs::check_refs(spec)?;
    if spec.batch_size == 0 {
        return err("batch_size", "must be > 0");
    }
    if spec.batch_size as usize > loader_proto::batch::MAX_SAMPLES {
        return err(
            "batch_size",
            format!(
                "{} exceeds the limit of {} samples per batch",
                spec.batch_size,
                loader_proto::batch::MAX_SAMPLES
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
    if spec.shared.is_some() && spec.name.is_empty() {
        return err("shared", "a shared stream needs a name: trainers subscribe to it by name");
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
                "only image datasets (image_folder, webdataset, parquet with an image_column) take transforms, not {}",
                kind_name(kind)
            ),
        );
    }
    Ok(())
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

/// Most lanes a job reads: one per worker that may serve it.
pub const MAX_LANES: u32 = 4096;
/// Largest shuffle buffer: a reader holds up to this many samples per lane.
pub const MAX_SHUFFLE_BUFFER: u32 = 1 << 20;

/// Validates a job spec and returns its plan.
pub fn plan(spec: &JobSpec) -> Result<Plan, SpecError> {
    check(spec)?;
    crate::blob_refs::check_filled(spec)?;
    let Some(dataset) = &spec.dataset else {
        return err("dataset", format!("missing; expected one of: {KINDS}"));
    };
    let num_samples = num_samples(dataset)?;
    let sampler = spec.sampler.unwrap_or_default();
    let shards = match &dataset.kind {
        Some(Kind::Webdataset(w)) => Some(w.shard_samples.as_slice().into()),
        Some(Kind::Custom(c)) if !c.shard_samples.is_empty() => Some(c.shard_samples.as_slice().into()),
        Some(Kind::Parquet(p)) if sampler.block_shuffle => {
            Some(p.file_rows.iter().flat_map(|f| f.row_groups.iter().copied()).collect())
        }
        _ if sampler.block_shuffle => {
            return err(
                "sampler.block_shuffle",
                format!("only a Parquet dataset is read in blocks (row groups), not {}", kind_name_of(dataset)),
            );
        }
        _ => None,
    };
    for (field, set) in [("sampler.lanes", sampler.lanes > 0), ("sampler.shuffle_buffer", sampler.shuffle_buffer > 0)] {
        if set && shards.is_none() {
            return err(
                field,
                format!(
                    "only for a sharded dataset (webdataset, a dataset with shard_samples, Parquet with block_shuffle), not {}",
                    kind_name_of(dataset)
                ),
            );
        }
    }
    if sampler.lanes > MAX_LANES {
        return err("sampler.lanes", format!("{} is more than {MAX_LANES}", sampler.lanes));
    }
    if sampler.shuffle_buffer > MAX_SHUFFLE_BUFFER {
        return err("sampler.shuffle_buffer", format!("{} samples is more than {MAX_SHUFFLE_BUFFER}", sampler.shuffle_buffer));
    }
    if sampler.shuffle_buffer > 0 && !sampler.shuffle {
        // Left alone, the windows would shuffle a job that asked for order.
        return err("sampler.shuffle_buffer", String::from("shuffles only with sampler.shuffle: true (set it, or drop the buffer)"));
    }
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
        shuffle_within_shards: sampler.block_shuffle || sampler.shuffle_buffer > 0,
        shuffle_window: u64::from(sampler.shuffle_buffer),
        lanes: sampler.lanes,
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
    use crate::mixture::weight_units;
    use loader_proto::pb::{
        DatasetSpec, Dtype, MixSpec,
        CustomSpec, Decode, ImageFolderSpec, MixSource, MixStage, NpyArray, NpySpec,
        RandomResizedCrop, SamplerSpec, SyntheticSpec, TokensSpec, Transform, WebDatasetSpec,
        transform::Op,
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
        let longest = JobSpec { name: "n".repeat(MAX_NAME_LEN), ..synthetic() };
        assert!(plan(&longest).is_ok());
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
                "name",
                JobSpec {
                    name: "n".repeat(100_000),
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
        use loader_proto::pb::EpochResume;
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
            ..Default::default()
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
    fn a_submitted_listing_path_is_refused_its_own_or_a_sources() {
        let listed = Kind::ImageFolder(ImageFolderSpec {
            path: "s3://b/train".into(),
            num_samples: 100,
            listing: "/tmp/listing".into(),
            ..Default::default()
        });
        let e = check(&with(listed.clone(), train())).expect_err("a worker's field");
        assert_eq!(e.field, "dataset.image_folder.listing");
        let e = check(&mixed(mix(vec![("a", 1.0, Some(synth(100))), ("b", 1.0, Some(listed))]))).expect_err("a source's");
        assert_eq!(e.field, "dataset.mix.sources[1].dataset.image_folder.listing");
        assert!(e.problem.contains("leave it empty"), "{e}");
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
    fn a_custom_stream_plans_from_its_shard_counts_and_reads_lanes() {
        use loader_proto::pb::SamplerSpec;
        let stream = |shard_samples: Vec<u64>, num_samples: u64| {
            Kind::Custom(CustomSpec { name: "python".into(), num_samples, shard_samples, ..Default::default() })
        };
        let mut spec = with(stream(vec![5, 0, 7], 12), vec![]);
        spec.sampler = Some(SamplerSpec { shuffle: true, lanes: 2, shuffle_buffer: 3, ..Default::default() });
        let p = plan(&spec).expect("a stream");
        assert_eq!((p.shards.as_deref(), p.lanes, p.shuffle_window, p.shuffle_within_shards), (Some(&[5u64, 0, 7][..]), 2, 3, true));
        let e = plan(&JobSpec { dataset: with(stream(vec![5, 0, 6], 12), vec![]).dataset, ..spec.clone() }).expect_err("counts");
        assert_eq!(e.to_string(), "invalid job spec: dataset.custom.shard_samples: add up to 11, not num_samples 12");
        for (sampler, field) in [
            (SamplerSpec { lanes: 2, ..Default::default() }, "sampler.lanes"),
            (SamplerSpec { shuffle: true, shuffle_buffer: 8, ..Default::default() }, "sampler.shuffle_buffer"),
        ] {
            let e = plan(&JobSpec { sampler: Some(sampler), ..synthetic() }).expect_err(field);
            assert_eq!(
                e.to_string(),
                format!("invalid job spec: {field}: only for a sharded dataset (webdataset, a dataset with shard_samples, Parquet with block_shuffle), not synthetic")
            );
        }
        let e = plan(&JobSpec { sampler: Some(SamplerSpec { lanes: MAX_LANES + 1, ..Default::default() }), ..spec.clone() }).expect_err("lanes");
        assert_eq!(e.to_string(), format!("invalid job spec: sampler.lanes: {} is more than {MAX_LANES}", MAX_LANES + 1));
        let unshuffled = SamplerSpec { shuffle_buffer: 3, ..Default::default() };
        let e = plan(&JobSpec { sampler: Some(unshuffled), ..spec.clone() }).expect_err("a buffer without shuffle");
        assert_eq!(
            e.to_string(),
            "invalid job spec: sampler.shuffle_buffer: shuffles only with sampler.shuffle: true (set it, or drop the buffer)"
        );
    }

    #[test]
    fn a_parquet_job_plans_from_its_filled_counts_and_block_shuffles_by_row_group() {
        use loader_proto::pb::{ParquetFileRows, ParquetSpec, SamplerSpec};
        let filled = ParquetSpec {
            files: vec!["a.parquet".into(), "b.parquet".into()],
            columns: vec!["x".into()],
            file_rows: vec![ParquetFileRows { row_groups: vec![4, 3] }, ParquetFileRows { row_groups: vec![5] }],
            num_samples: 12,
            row_bytes: vec![12],
            image_column: String::new(),
        };
        let mut spec = with(Kind::Parquet(filled.clone()), vec![]);
        assert_eq!(plan(&spec).expect("parquet").num_samples, 12);
        assert_eq!(plan(&spec).expect("parquet").shards, None, "a plain shuffle permutes every row");
        spec.sampler = Some(SamplerSpec { shuffle: true, seed: 1, block_shuffle: true, ..Default::default() });
        let p = plan(&spec).expect("block shuffle");
        assert_eq!((p.shards.as_deref(), p.shuffle_within_shards), (Some(&[4u64, 3, 5][..]), true));
        let e = plan(&JobSpec { sampler: spec.sampler, ..synthetic() }).expect_err("not in blocks");
        assert_eq!(e.to_string(), "invalid job spec: sampler.block_shuffle: only a Parquet dataset is read in blocks (row groups), not synthetic");
        for (broken, field) in [
            (ParquetSpec { file_rows: vec![], ..filled.clone() }, "dataset.parquet.file_rows"),
            (ParquetSpec { row_bytes: vec![], ..filled.clone() }, "dataset.parquet.row_bytes"),
            (ParquetSpec { num_samples: 13, ..filled.clone() }, "dataset.parquet.num_samples"),
            (ParquetSpec { files: vec![], file_rows: vec![], ..filled.clone() }, "dataset.parquet.files"),
            (ParquetSpec { columns: vec!["x".into(), "x".into()], ..filled.clone() }, "dataset.parquet.columns[1]"),
            (ParquetSpec { image_column: "x".into(), ..filled.clone() }, "dataset.parquet.columns[0]"),
        ] {
            let e = plan(&with(Kind::Parquet(broken), vec![])).expect_err(field);
            let e = e.to_string();
            assert!(e.starts_with(&format!("invalid job spec: {field}: ")) && !e.contains('\n'), "{e}");
        }
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
                "only image datasets (image_folder, webdataset, parquet with an image_column) take transforms, not npy",
                with(npy(&["x"]), train()),
            ),
            (
                "transforms",
                "only image datasets (image_folder, webdataset, parquet with an image_column) take transforms, not synthetic",
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

    fn synth(num_samples: u64) -> Kind {
        Kind::Synthetic(SyntheticSpec {
            num_samples,
            shape: vec![4],
            dtype: Dtype::U8 as i32,
            cost_ns: 0,
            wait_ns_by_epoch: Vec::new(),
        })
    }

    /// A mixture of `sources` (name, weight, dataset) of 1000 samples an
    /// epoch, blocks of 64.
    fn mix(sources: Vec<(&str, f64, Option<Kind>)>) -> MixSpec {
        MixSpec {
            sources: sources
                .into_iter()
                .map(|(name, weight, kind)| MixSource {
                    name: name.into(),
                    weight,
                    dataset: kind.map(|k| DatasetSpec { kind: Some(k) }),
                })
                .collect(),
            samples_per_epoch: 1000,
            block: 64,
            ..Default::default()
        }
    }

    /// Two synthetic sources `a` and `b` of 100 and 300 samples.
    fn two(wa: f64, wb: f64) -> MixSpec {
        mix(vec![
            ("a", wa, Some(synth(100))),
            ("b", wb, Some(synth(300))),
        ])
    }

    fn mixed(m: MixSpec) -> JobSpec {
        with(Kind::Mix(m), vec![])
    }

    #[test]
    fn a_mixture_plans_in_stream_order_over_its_epoch() {
        let spec = JobSpec {
            sampler: Some(SamplerSpec {
                shuffle: true,
                seed: 3,
                ..Default::default()
            }),
            ..mixed(two(0.25, 0.75))
        };
        let p = plan(&spec).expect("a mixture plans");
        assert_eq!(p.num_samples, 1000, "num_samples is samples_per_epoch");
        assert!(
            !p.shuffle,
            "the mixture shuffles itself; the plan keeps its order"
        );
        assert_eq!(p.seed, 3);
        let m = mix_plan(&spec).expect("mix plan").expect("a mixture");
        assert_eq!(m.sources(), 2);
        assert_eq!(mix_plan(&synthetic()).expect("not a mixture"), None);
        // Without a block, the job's global batch is the block.
        let unblocked = JobSpec {
            dataset: Some(DatasetSpec {
                kind: Some(Kind::Mix(MixSpec {
                    block: 0,
                    ..two(1.0, 1.0)
                })),
            }),
            ..spec.clone()
        };
        assert!(mix_plan(&unblocked).expect("block 0").is_some());
        // A mixture with image sources is an image dataset.
        let images = mix(vec![
            ("img", 1.0, Some(folder(10))),
            ("s", 1.0, Some(synth(5))),
        ]);
        assert!(is_image_dataset(&Kind::Mix(images.clone())));
        assert!(!is_image_dataset(&Kind::Mix(two(1.0, 1.0))));
        assert_eq!(
            plan(&with(Kind::Mix(images), train()))
                .expect("images mixed")
                .num_samples,
            1000
        );
    }

    #[test]
    fn a_mixtures_default_epoch_draws_its_heaviest_source_once_whole() {
        assert_eq!(weight_units(&[0.2, 0.3, 0.5]), Ok(vec![2, 3, 5]));
        let m = mix(vec![
            ("small", 0.2, Some(synth(1000))),
            ("mid", 0.3, Some(synth(10_000))),
            ("big", 0.5, Some(synth(100_000))),
        ]);
        assert_eq!(mix_source_sizes(&m), Ok(vec![1000, 10_000, 100_000]));
        assert_eq!(mix_default_epoch(&m), Ok(200_000));
        // 300 and 100 samples at 1:3: the 100 at 3/4 takes ceil(100 x 4/3).
        let m = mix(vec![
            ("a", 1.0, Some(synth(300))),
            ("b", 3.0, Some(synth(100))),
        ]);
        assert_eq!(mix_default_epoch(&m), Ok(134));
        // A tie: the first of the heaviest sources.
        assert_eq!(mix_default_epoch(&two(1.0, 1.0)), Ok(200));
        // A source whose size is unknown is named.
        let m = mix(vec![("a", 1.0, Some(synth(0)))]);
        assert_eq!(
            mix_default_epoch(&m).expect_err("no samples").field,
            "dataset.mix.sources[0].dataset.synthetic.num_samples"
        );
    }

    #[test]
    fn bad_mixtures_name_the_field() {
        let tokens = |path: &str| {
            Kind::Tokens(TokensSpec {
                path: path.into(),
                dtype: Dtype::U16 as i32,
                context_length: 8,
                num_tokens: 100,
            })
        };
        let staged = |stages: Vec<(u64, Vec<f64>)>, weights_from| MixSpec {
            stages: stages
                .into_iter()
                .map(|(start, weights)| MixStage { start, weights })
                .collect(),
            weights_from,
            ..two(1.0, 1.0)
        };
        let inner = Kind::Mix(two(1.0, 1.0));
        let cases: Vec<(&str, &str, MixSpec)> = vec![
            (
                "dataset.mix.sources",
                "must list at least one source",
                mix(vec![]),
            ),
            (
                "dataset.mix.sources",
                "257 sources exceed the limit of 256",
                MixSpec {
                    sources: (0..=MAX_MIX_SOURCES)
                        .map(|i| MixSource {
                            name: format!("s{i}"),
                            weight: 1.0,
                            dataset: Some(DatasetSpec {
                                kind: Some(synth(10)),
                            }),
                        })
                        .collect(),
                    ..two(1.0, 1.0)
                },
            ),
            (
                "dataset.mix.sources[0].name",
                "must be 1 to 255 bytes",
                mix(vec![("", 1.0, Some(synth(10)))]),
            ),
            (
                "dataset.mix.sources[1].name",
                "`a` names two sources",
                mix(vec![
                    ("a", 1.0, Some(synth(10))),
                    ("a", 1.0, Some(synth(10))),
                ]),
            ),
            (
                "dataset.mix.sources[1].weight",
                "must be a finite number >= 0, got -1",
                two(1.0, -1.0),
            ),
            (
                "dataset.mix.sources[0].weight",
                "must be a finite number >= 0, got NaN",
                two(f64::NAN, 1.0),
            ),
            (
                "dataset.mix.sources[1].weight",
                "must be a finite number >= 0, got inf",
                two(1.0, f64::INFINITY),
            ),
            (
                "dataset.mix.sources",
                "weights: a mixture needs at least one source with a weight above 0",
                two(0.0, 0.0),
            ),
            (
                "dataset.mix.sources",
                "weights: a weight above 0 is under a millionth of the weights' sum",
                two(1.0, 1e-9),
            ),
            (
                "dataset.mix.sources",
                "weights: the weights add up to more than a float holds",
                two(f64::MAX, f64::MAX),
            ),
            (
                "dataset.mix.sources[1].dataset",
                "missing; expected one of: synthetic",
                mix(vec![("a", 1.0, Some(synth(10))), ("b", 1.0, None)]),
            ),
            (
                "dataset.mix.sources[0].dataset",
                "a mixture cannot hold a mixture",
                mix(vec![("inner", 1.0, Some(inner))]),
            ),
            (
                "dataset.mix.sources[1].dataset.tokens.path",
                "must name the token file",
                mix(vec![
                    ("a", 1.0, Some(tokens("a.bin"))),
                    ("b", 1.0, Some(tokens(""))),
                ]),
            ),
            (
                "dataset.mix.sources[0].dataset.synthetic.num_samples",
                "must be > 0",
                mix(vec![("a", 1.0, Some(synth(0)))]),
            ),
            (
                "dataset.mix.source_field",
                "must be at most 255 bytes",
                MixSpec {
                    source_field: "s".repeat(256),
                    ..two(1.0, 1.0)
                },
            ),
            (
                "dataset.mix.stages[0].weights",
                "gives 1 weights for 2 sources",
                staged(vec![(0, vec![1.0])], 64),
            ),
            (
                "dataset.mix.stages[0].weights",
                "weights must be finite and >= 0",
                staged(vec![(0, vec![1.0, -2.0])], 64),
            ),
            (
                "dataset.mix.stages[0].start",
                "the first stage starts at 0",
                staged(vec![(64, vec![1.0, 2.0])], 128),
            ),
            (
                "dataset.mix.stages[1].start",
                "the first stage starts at 0, each later one after the one before",
                staged(vec![(0, vec![1.0, 2.0]), (0, vec![2.0, 1.0])], 128),
            ),
            (
                "dataset.mix.weights_from",
                "must be 0 without earlier stages",
                staged(vec![], 64),
            ),
            (
                "dataset.mix.weights_from",
                "must be after the last stage's start 64",
                staged(vec![(0, vec![1.0, 2.0]), (64, vec![2.0, 1.0])], 64),
            ),
            (
                "dataset.mix.samples_per_epoch",
                "is 0; the submitter fills it in",
                MixSpec {
                    samples_per_epoch: 0,
                    ..two(1.0, 1.0)
                },
            ),
        ];
        for (field, problem, m) in cases {
            let e = plan(&mixed(m)).expect_err(field);
            assert_eq!(e.field, field, "{e}");
            assert!(e.problem.starts_with(problem), "{field}: {e}");
            assert!(!e.to_string().contains('\n'), "{e}");
        }
        // Stages that `check` accepts but that do not fall on block
        // boundaries are refused when the mixture is planned.
        let e = plan(&mixed(staged(vec![(0, vec![1.0, 2.0])], 100))).expect_err("off the block");
        assert_eq!(e.field, "dataset.mix.weights_from", "{e}");
        assert!(e.problem.contains("multiple of the block"), "{e}");
        assert!(!e.to_string().contains('\n'), "{e}");
        // A good staged mixture plans.
        assert!(plan(&mixed(staged(vec![(0, vec![1.0, 2.0])], 128))).is_ok());
    }
}
