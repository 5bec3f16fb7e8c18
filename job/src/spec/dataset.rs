//! The checks of a spec's dataset, one kind at a time (mixtures among
//! them), and the number of samples each holds, from the spec alone.

use loader_proto::batch::MAX_NAME_LEN;
use loader_proto::pb::{DatasetSpec, Dtype, JobSpec, MixSpec, dataset_spec::Kind};

use crate::error::{SpecError, err};
use crate::mixture::{MixPlan, weight_units};

/// The dataset kinds a spec may name, for messages.
pub(super) const KINDS: &str = "synthetic, tokens, image_folder, webdataset, npy, parquet, custom, mix";

/// Most sources one mixture lists.
pub const MAX_MIX_SOURCES: usize = 256;

/// Checks a Parquet dataset's files and columns.
fn parquet_fields(p: &loader_proto::pb::ParquetSpec) -> Result<(), SpecError> {
    if p.files.is_empty() {
        return err("dataset.parquet.files", "must list at least one Parquet file");
    }
    if let Some(i) = p.files.iter().position(String::is_empty) {
        return err(format!("dataset.parquet.files[{i}]"), "empty path");
    }
    for (i, c) in p.columns.iter().enumerate() {
        if c.is_empty() || c.len() > MAX_NAME_LEN {
            return err(format!("dataset.parquet.columns[{i}]"), format!("must be 1 to {MAX_NAME_LEN} bytes"));
        }
        if p.columns[..i].contains(c) || *c == p.image_column {
            return err(format!("dataset.parquet.columns[{i}]"), format!("`{c}` is named twice"));
        }
    }
    if p.image_column.len() > MAX_NAME_LEN {
        return err("dataset.parquet.image_column", format!("must be at most {MAX_NAME_LEN} bytes"));
    }
    Ok(())
}

/// The rows of a Parquet dataset, checked against its row groups.
fn parquet_rows(p: &loader_proto::pb::ParquetSpec) -> Result<u64, SpecError> {
    let filled = "the submitter fills it in by reading the files' footers (the SDK's spec builders do)";
    if p.file_rows.len() != p.files.len() {
        return err(
            "dataset.parquet.file_rows",
            format!("has {} entries for {} files; {filled}", p.file_rows.len(), p.files.len()),
        );
    }
    if (p.columns.is_empty() && p.image_column.is_empty()) || p.row_bytes.len() != p.columns.len() {
        return err("dataset.parquet.row_bytes", format!("needs one size per column read; {filled}"));
    }
    let total = p.file_rows.iter().flat_map(|f| &f.row_groups).try_fold(0u64, |acc, &n| acc.checked_add(n));
    match total {
        Some(0) => err("dataset.parquet.file_rows", "the files hold no row"),
        Some(n) if n == p.num_samples => Ok(n),
        Some(n) => err(
            "dataset.parquet.num_samples",
            format!("is {}, the row groups hold {n} rows; {filled}", p.num_samples),
        ),
        None => err("dataset.parquet.file_rows", "row counts overflow"),
    }
}

pub(super) fn kind_name_of(dataset: &DatasetSpec) -> &'static str {
    dataset.kind.as_ref().map_or("no dataset", kind_name)
}

pub(super) fn kind_name(kind: &Kind) -> &'static str {
    match kind {
        Kind::Synthetic(_) => "synthetic",
        Kind::Tokens(_) => "tokens",
        Kind::ImageFolder(_) => "image_folder",
        Kind::Webdataset(_) => "webdataset",
        Kind::Npy(_) => "npy",
        Kind::Parquet(_) => "parquet",
        Kind::Custom(_) => "custom",
        Kind::Mix(_) => "mix",
    }
}

/// Checks that a submitted spec leaves empty the fields a worker sets from
/// the job's blobs (an image folder's `listing`), its own or a mixture
/// source's. Not part of [`dataset_fields`]: a worker's spec, with them
/// set, is read with that.
pub(super) fn no_worker_fields(kind: &Kind) -> Result<(), SpecError> {
    let set = |kind: Option<&Kind>| matches!(kind, Some(Kind::ImageFolder(f)) if !f.listing.is_empty());
    let at = match kind {
        Kind::Mix(m) => m
            .sources
            .iter()
            .position(|s| set(s.dataset.as_ref().and_then(|d| d.kind.as_ref())))
            .map(|i| format!("dataset.mix.sources[{i}].dataset.image_folder.listing")),
        kind => set(Some(kind)).then(|| "dataset.image_folder.listing".to_owned()),
    };
    match at {
        Some(field) => err(field, "is set by workers, from the listing the submitter carries as the blob `listing`; leave it empty"),
        None => Ok(()),
    }
}

/// Checks a dataset's fields other than its counts.
pub(super) fn dataset_fields(kind: &Kind) -> Result<(), SpecError> {
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
        Kind::Parquet(p) => parquet_fields(p)?,
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
        .map_err(|e| match e {
            // The sources' weights are the last stage, from `weights_from`.
            crate::mixture::MixError::StageStart(i) if i == m.stages.len() => SpecError {
                field: "dataset.mix.weights_from".into(),
                problem: format!(
                    "{} must be after the last stage's start and a multiple of the block ({block})",
                    m.weights_from
                ),
            },
            crate::mixture::MixError::StageStart(i) => SpecError {
                field: format!("dataset.mix.stages[{i}].start"),
                problem: format!(
                    "must be after the stage before it and a multiple of the block ({block})"
                ),
            },
            e => SpecError {
                field: "dataset.mix".into(),
                problem: e.to_string(),
            },
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
        Kind::Parquet(p) => parquet_rows(p),
        Kind::Custom(c) => {
            if c.num_samples == 0 {
                return err("dataset.custom.num_samples", "must be > 0");
            }
            if !c.shard_samples.is_empty() {
                let sum = c.shard_samples.iter().try_fold(0u64, |a, &n| a.checked_add(n));
                if sum != Some(c.num_samples) {
                    return err(
                        "dataset.custom.shard_samples",
                        format!("add up to {}, not num_samples {}", sum.map_or("more than 2^64".into(), |s| s.to_string()), c.num_samples),
                    );
                }
            }
            Ok(c.num_samples)
        }
        Kind::Mix(m) => {
            mix_source_sizes(m)?;
            if m.samples_per_epoch == 0 {
                return filled(
                    "dataset.mix.samples_per_epoch",
                    "drawing the largest-weight source once whole",
                );
            }
            Ok(m.samples_per_epoch)
        }
    }
}
