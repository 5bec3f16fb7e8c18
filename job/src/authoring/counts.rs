//! What a submitter reads from a dataset's files so the coordinator can
//! plan without opening them: the token count, the image listing's size and
//! fingerprint, the samples of each shard, the rows of the npy arrays. The
//! rules come from `loader_listing`, the same code the workers run.

use std::path::Path;

use loader_listing::ListingError;
use loader_proto::blob::IMAGE_FOLDER_LISTING;
use loader_proto::pb::{Dtype, dataset_spec::Kind};

use crate::Error;

/// Fills in the counts of `kind` from its files. The listing of an image
/// folder in a bucket goes into `listings` under the name of the blob it
/// travels as (`listing`, or `s/listing` for a mixture's source `s`).
pub(super) fn fill(kind: &mut Kind, listings: &mut Vec<(String, Vec<u8>)>) -> Result<(), Error> {
    fill_source(kind, "", listings)
}

fn fill_source(kind: &mut Kind, blob_prefix: &str, listings: &mut Vec<(String, Vec<u8>)>) -> Result<(), Error> {
    match kind {
        Kind::Synthetic(_) | Kind::Custom(_) => {}
        Kind::Tokens(t) => t.num_tokens = count_tokens(Path::new(&t.path), t.dtype)?,
        Kind::ImageFolder(f) => {
            let manifest = Some(Path::new(&f.manifest)).filter(|m| !m.as_os_str().is_empty());
            let listing = loader_listing::image_folder::list(Path::new(&f.path), manifest)?;
            f.num_samples = listing.samples.len() as u64;
            f.fingerprint = listing.fingerprint();
            if let Some(bytes) = loader_listing::bucket_listing::encode(&listing) {
                listings.push((format!("{blob_prefix}{IMAGE_FOLDER_LISTING}"), bytes));
            }
        }
        Kind::Webdataset(w) => {
            w.shard_samples = w
                .shards
                .iter()
                .map(|s| loader_listing::shard::index(Path::new(s)).map(|i| i.samples.len() as u64))
                .collect::<Result<_, _>>()?;
        }
        Kind::Npy(n) => {
            let mut rows: Option<(u64, &str)> = None;
            for a in &n.arrays {
                let h = loader_listing::npy::read_header(Path::new(&a.path))?;
                match rows {
                    None => rows = Some((h.rows(), &a.name)),
                    Some((r, first)) if r != h.rows() => {
                        return Err(ListingError {
                            path: a.path.clone(),
                            problem: format!("holds {} rows, array `{first}` holds {r}; every array needs the same rows", h.rows()),
                        }
                        .into());
                    }
                    Some(_) => {}
                }
            }
            n.num_samples = rows.map_or(0, |(r, _)| r);
        }
        Kind::Parquet(p) => fill_parquet(p)?,
        Kind::Mix(m) => {
            for source in &mut m.sources {
                if let Some(kind) = source.dataset.as_mut().and_then(|d| d.kind.as_mut()) {
                    fill_source(kind, &format!("{}/", source.name), listings)?;
                }
            }
            if m.samples_per_epoch == 0 {
                m.samples_per_epoch = crate::spec::mix_default_epoch(m)?;
            }
        }
    }
    Ok(())
}

/// Fills in a Parquet dataset's row groups, rows, columns (every column of
/// the first file when none are named) and their row sizes; every file must
/// hold the same columns with the same tensors.
fn fill_parquet(p: &mut loader_proto::pb::ParquetSpec) -> Result<(), Error> {
    p.files = expand_patterns(&p.files)?;
    let mut chosen: Option<Vec<(String, loader_listing::parquet::ColumnTensor)>> = None;
    let mut file_rows = Vec::with_capacity(p.files.len());
    for file in &p.files {
        let path = Path::new(file);
        let footer = loader_listing::parquet::read_footer(path)?;
        let names: Vec<String> = match &chosen {
            Some(columns) => columns.iter().map(|(n, _)| n.clone()).collect(),
            None => p.columns.clone(),
        };
        if !p.image_column.is_empty() {
            footer.check_image(path, &p.image_column)?;
        }
        let columns = footer.select(path, &names, &p.image_column)?;
        if let Some(first) = &chosen
            && let Some(((name, want), (_, got))) = first.iter().zip(&columns).find(|(a, b)| a.1 != b.1)
        {
            return Err(ListingError {
                path: file.clone(),
                problem: format!(
                    "column `{name}` is {:?} {:?} here, {:?} {:?} in {}; every file needs the same columns",
                    got.dtype, got.shape, want.dtype, want.shape, p.files[0]
                ),
            }
            .into());
        }
        chosen.get_or_insert(columns);
        file_rows.push(loader_proto::pb::ParquetFileRows { row_groups: footer.row_groups });
    }
    let columns = chosen.unwrap_or_default();
    p.row_bytes = columns
        .iter()
        .map(|(name, t)| {
            t.row_bytes().ok_or_else(|| ListingError {
                path: p.files[0].clone(),
                problem: format!("column `{name}`: rows of shape {:?} are too large", t.shape),
            })
        })
        .collect::<Result<_, _>>()?;
    p.columns = columns.into_iter().map(|(n, _)| n).collect();
    p.num_samples = file_rows.iter().flat_map(|f| &f.row_groups).sum();
    p.file_rows = file_rows;
    Ok(())
}

/// `files` with every glob pattern (`*`, `?`, `[...]`) replaced by the
/// files it matches, in sorted order; a pattern that matches nothing is an
/// error naming it.
fn expand_patterns(files: &[String]) -> Result<Vec<String>, Error> {
    let mut out = Vec::with_capacity(files.len());
    for file in files {
        if !file.contains(['*', '?', '[']) {
            out.push(file.clone());
            continue;
        }
        let bad = |problem: String| ListingError { path: file.clone(), problem };
        if loader_storage::is_url(file) {
            return Err(bad("patterns are expanded on local paths only: name each object of the bucket".into()).into());
        }
        let mut matched: Vec<String> = glob::glob(file)
            .map_err(|e| bad(format!("not a file pattern: {e}")))?
            .map(|entry| entry.map(|p| p.display().to_string()).map_err(|e| bad(e.to_string())))
            .collect::<Result<_, _>>()?;
        if matched.is_empty() {
            return Err(bad("matches no file".into()).into());
        }
        matched.sort();
        out.extend(matched);
    }
    Ok(out)
}

/// Tokens in the file at `path`, from its size.
fn count_tokens(path: &Path, dtype: i32) -> Result<u64, Error> {
    let bad = |cause: String| Error::TokenFile { path: path.to_path_buf(), cause };
    let name = path.to_string_lossy();
    let bytes = if loader_storage::is_url(&name) {
        // An object in a store: its size, from one HEAD request.
        let url = loader_storage::ObjectUrl::parse(&name).map_err(|e| bad(e.problem))?;
        loader_storage::RemoteObject::open(&url).map_err(|e| bad(e.problem))?.size()
    } else {
        let meta = std::fs::metadata(path).map_err(|e| bad(e.to_string()))?;
        if !meta.is_file() {
            return Err(bad("not a regular file".into()));
        }
        meta.len()
    };
    let size = match Dtype::try_from(dtype) {
        Ok(d @ (Dtype::U16 | Dtype::U32)) => d.size() as u64,
        // Let spec validation give its usual message for the dtype.
        _ => return Ok(0),
    };
    if bytes % size != 0 {
        return Err(bad(format!("{bytes} bytes is not a whole number of {size}-byte tokens")));
    }
    Ok(bytes / size)
}
