//! The objects under a prefix, and many small objects fetched at once.
//!
//! An image folder in a bucket is one object per image: listed once (the
//! store's paginated LIST, a thousand keys a page), then read one GET per
//! image, many in flight, each pinned to the ETag the listing saw.

use bytes::Bytes;
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{GetOptions, ObjectMeta, ObjectStore};

use crate::error::ErrorKind;
use crate::object::in_flight;
use crate::stores::store;
use crate::{ObjectUrl, StorageError, io};

/// One object found under a prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// Its key, below the prefix listed (no leading `/`).
    pub key: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its ETag, when the store gives one.
    pub etag: Option<String>,
}

/// Class folders listed at once: a bucket answers a LIST a thousand keys
/// at a time, so ImageNet's 1.28 M images are 1,281 pages, a minute and
/// more one after the other, and a few seconds when its 1,000 class
/// folders are listed side by side.
const FOLDERS_AT_ONCE: usize = 32;

/// Every object under `prefix` (a "folder": `s3://bucket/train/`), at any
/// depth, in no particular order. The folders right under it (an image
/// folder's classes) are listed side by side.
pub fn list(prefix: &ObjectUrl) -> Result<Vec<Listed>, StorageError> {
    let store = store(prefix)?;
    let name = prefix.to_string();
    let root = prefix.key.trim_end_matches('/').to_owned();
    let (client, endpoint) = (store.client.clone(), store.endpoint.clone());
    let at = name.clone();
    let listed = io::wait(async move {
        let path = (!root.is_empty()).then(|| Path::from(root.as_str()));
        let started = std::time::Instant::now();
        let top = client.list_with_delimiter(path.as_ref()).await;
        crate::meters::request("list", top.is_ok(), started.elapsed(), 0);
        let top = top?;
        let folders = futures::stream::iter(top.common_prefixes.into_iter().map(|folder| walk(client.clone(), folder)))
        .buffer_unordered(FOLDERS_AT_ONCE)
        .try_collect::<Vec<_>>()
        .await?;
        let mut found = top.objects;
        found.extend(folders.into_iter().flatten());
        Ok::<_, object_store::Error>((root, found))
    })
    .map_err(|e| StorageError::new(&at, ErrorKind::Unavailable, e.to_string()))?;
    let (root, found) = listed.map_err(|e| StorageError::from_store(&name, &endpoint, e))?;
    Ok(found
        .into_iter()
        .filter_map(|meta| {
            // Keys come percent-encoded (`object_store::path::Path`); a GET
            // encodes the raw key again.
            let key = percent_encoding::percent_decode_str(meta.location.as_ref()).decode_utf8().ok()?;
            let below = if root.is_empty() { &*key } else { key.strip_prefix(root.as_str())?.strip_prefix('/')? };
            Some(Listed { key: below.to_owned(), size: meta.size, etag: meta.e_tag })
        })
        .collect())
}

/// Longest key S3 accepts, in bytes: a folder below which a store names
/// deeper folders, each longer than the last, runs out before this.
const MAX_KEY: usize = 1024;

/// Every object in `folder` and the folders below it, one listing (with a
/// delimiter) each. A flat class folder is one listing, as without a
/// delimiter; and a store that keeps its objects as files (s3s-fs, MinIO
/// on a plain disk) then reads one directory per listing instead of every
/// file under the bucket, which s3s-fs does for a listing without one
/// (22 ms per class folder of a bucket of 12,800 images: 2.2 s for its 100
/// folders, for the submitter and again for each worker). A folder the
/// store names below another is walked only if it is longer and within
/// [`MAX_KEY`], so a store that answers a folder with itself (or with
/// endless deeper ones) cannot keep the walk going.
async fn walk(client: Arc<dyn ObjectStore>, folder: Path) -> Result<Vec<ObjectMeta>, object_store::Error> {
    let mut found = Vec::new();
    let mut folders = vec![folder];
    while let Some(folder) = folders.pop() {
        let started = std::time::Instant::now();
        let page = client.list_with_delimiter(Some(&folder)).await;
        crate::meters::request("list", page.is_ok(), started.elapsed(), 0);
        let page = page?;
        found.extend(page.objects);
        let (this, deeper) = (folder.as_ref().len(), |p: &Path| p.as_ref().len());
        folders.extend(page.common_prefixes.into_iter().filter(|p| deeper(p) > this && deeper(p) <= MAX_KEY));
    }
    Ok(found)
}

/// Fetches every object of `objects` (its URL and the ETag it must still
/// have), many at once, and returns their bytes in the same order.
pub fn get_many(objects: &[(ObjectUrl, Option<String>)]) -> Vec<Result<Bytes, StorageError>> {
    let requests: Vec<_> = objects.iter().map(|(url, etag)| fetch(url.clone(), etag.clone())).collect();
    let n = requests.len();
    match io::wait(futures::stream::iter(requests).buffered(n.max(1)).collect::<Vec<_>>()) {
        Ok(results) => results,
        Err(e) => objects.iter().map(|(url, _)| Err(StorageError::new(url.to_string(), ErrorKind::Unavailable, e.to_string()))).collect(),
    }
}

/// One GET of a whole object, which must still have `etag` when given,
/// within the process's bound on requests in flight. An object gone since
/// it was listed has changed.
pub(crate) async fn fetch(url: ObjectUrl, etag: Option<String>) -> Result<Bytes, StorageError> {
    let name = url.to_string();
    let store = store(&url)?;
    let _permit = in_flight().acquire().await.map_err(|e| StorageError::new(&name, ErrorKind::Unavailable, e.to_string()))?;
    let options = GetOptions { if_match: etag, ..GetOptions::default() };
    let started = std::time::Instant::now();
    let got = match store.client.get_opts(&Path::from(url.key.as_str()), options).await {
        Ok(r) => r.bytes().await,
        Err(e) => Err(e),
    };
    let fetched = got.as_ref().map_or(0, |b| b.len() as u64);
    crate::meters::request("get", got.is_ok(), started.elapsed(), fetched);
    got.map_err(|e| match StorageError::from_store(&name, &store.endpoint, e) {
        e if e.kind == ErrorKind::NotFound => StorageError::changed(&name, "it was deleted"),
        other => other,
    })
}

/// Fetches one object, which must still have `etag` when given.
pub fn get(url: &ObjectUrl, etag: Option<String>) -> Result<Bytes, StorageError> {
    let mut got = get_many(&[(url.clone(), etag)]);
    got.pop().unwrap_or_else(|| Err(StorageError::new(url.to_string(), ErrorKind::Unavailable, "no answer")))
}

#[cfg(test)]
mod tests {
    use object_store::memory::InMemory;
    use object_store::{ObjectStoreExt, PutPayload};

    use super::*;

    #[tokio::test]
    async fn a_folder_is_walked_with_the_folders_below_it() {
        let store = InMemory::new();
        for key in ["train/cat/a.jpg", "train/cat/b.jpg", "train/cat/kittens/c.jpg", "train/cat/kittens/tiny/d.jpg", "train/dog/e.jpg"] {
            store.put(&Path::from(key), PutPayload::from_static(b"x")).await.expect("put");
        }
        let found = walk(Arc::new(store), Path::from("train/cat")).await.expect("walk");
        let mut keys: Vec<String> = found.into_iter().map(|m| m.location.to_string()).collect();
        keys.sort();
        assert_eq!(keys, ["train/cat/a.jpg", "train/cat/b.jpg", "train/cat/kittens/c.jpg", "train/cat/kittens/tiny/d.jpg"]);
    }

    /// A store whose every listing names, as folders below the one listed,
    /// that folder itself and one a level deeper: a walk that followed its
    /// answers would never end. Everything else is an in-memory store's.
    #[derive(Debug, Default)]
    struct Endless(InMemory, std::sync::atomic::AtomicUsize);

    impl std::fmt::Display for Endless {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "Endless")
        }
    }

    #[async_trait::async_trait]
    impl ObjectStore for Endless {
        async fn put_opts(&self, at: &Path, payload: PutPayload, opts: object_store::PutOptions) -> object_store::Result<object_store::PutResult> {
            self.0.put_opts(at, payload, opts).await
        }
        async fn put_multipart_opts(
            &self,
            at: &Path,
            opts: object_store::PutMultipartOptions,
        ) -> object_store::Result<Box<dyn object_store::MultipartUpload>> {
            self.0.put_multipart_opts(at, opts).await
        }
        async fn get_opts(&self, at: &Path, options: GetOptions) -> object_store::Result<object_store::GetResult> {
            self.0.get_opts(at, options).await
        }
        fn delete_stream(
            &self,
            at: futures::stream::BoxStream<'static, object_store::Result<Path>>,
        ) -> futures::stream::BoxStream<'static, object_store::Result<Path>> {
            self.0.delete_stream(at)
        }
        fn list(&self, prefix: Option<&Path>) -> futures::stream::BoxStream<'static, object_store::Result<ObjectMeta>> {
            self.0.list(prefix)
        }
        async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<object_store::ListResult> {
            self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let mut page = self.0.list_with_delimiter(prefix).await?;
            let folder = prefix.cloned().unwrap_or_default();
            page.common_prefixes.push(folder.clone());
            page.common_prefixes.push(folder.clone().join("again"));
            Ok(page)
        }
        async fn copy_opts(&self, from: &Path, to: &Path, options: object_store::CopyOptions) -> object_store::Result<()> {
            self.0.copy_opts(from, to, options).await
        }
    }

    #[tokio::test]
    async fn a_store_that_answers_a_folder_with_itself_or_deeper_ones_cannot_keep_the_walk_going() {
        let listed = Arc::new(Endless::default());
        listed.0.put(&Path::from("train/cat/a.jpg"), PutPayload::from_static(b"x")).await.expect("put");
        let found = walk(listed.clone(), Path::from("train/cat")).await.expect("walk");
        assert_eq!(found.iter().map(|m| m.location.to_string()).collect::<Vec<_>>(), ["train/cat/a.jpg"]);
        // The folder itself is not walked again, and the deeper ones end
        // at S3's longest key: one listing a level, none twice.
        let levels = (MAX_KEY - "train/cat".len()) / "/again".len();
        assert_eq!(listed.1.load(std::sync::atomic::Ordering::Relaxed), levels + 1);
    }
}