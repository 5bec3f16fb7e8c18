use super::*;

fn sha_of(bytes: &[u8]) -> String {
    let mut sha = Sha256::default();
    sha.update(bytes);
    sha.finish()
}

fn chunk(bytes: &[u8], offset: usize, len: usize) -> Chunk {
    let end = (offset + len).min(bytes.len());
    Chunk {
        sha256: sha_of(bytes),
        size: bytes.len() as u64,
        offset: offset as u64,
        data: Bytes::copy_from_slice(&bytes[offset..end]),
    }
}

/// Uploads `bytes` in `MAX_CHUNK` chunks, as a client does: ask, then send
/// from where the answer says until it is held.
fn upload(store: &BlobStore, bytes: &[u8], in_use: &HashSet<String>, now: Instant) -> Result<(), CoordinatorError> {
    let mut at = store.put(chunk(bytes, 0, 0), in_use, now)?;
    while !at.held {
        at = store.put(chunk(bytes, at.next_offset as usize, MAX_CHUNK), in_use, now)?;
    }
    Ok(())
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

#[test]
fn a_blob_uploaded_in_chunks_is_held_and_read_back_in_chunks() {
    let store = BlobStore::new(64 << 20);
    let bytes = pattern(2 * MAX_CHUNK + 12_345, 1);
    let sha = sha_of(&bytes);
    let now = Instant::now();
    assert!(!store.holds(&sha, bytes.len() as u64));
    upload(&store, &bytes, &HashSet::new(), now).expect("uploaded");
    assert!(store.holds(&sha, bytes.len() as u64));
    let mut back = Vec::new();
    loop {
        // Asking for more than a chunk gets a chunk.
        let (data, size) = store.get(&sha, back.len() as u64, u32::MAX, now).expect("read");
        assert_eq!(size, bytes.len() as u64);
        assert!(data.len() <= MAX_CHUNK);
        if data.is_empty() {
            break;
        }
        back.extend_from_slice(&data);
    }
    assert!(back == bytes, "same bytes");
    let (tail, _) = store.get(&sha, bytes.len() as u64 - 5, 100, now).expect("tail");
    assert_eq!(&tail[..], &bytes[bytes.len() - 5..]);
    let e = store.get(&sha, bytes.len() as u64 + 1, 1, now).expect_err("past the end");
    assert_eq!(tonic::Status::from(e).code(), tonic::Code::InvalidArgument);
    let e = store.get(&sha_of(b"other"), 0, 1, now).expect_err("unknown");
    assert_eq!(tonic::Status::from(e).code(), tonic::Code::NotFound);
}

#[test]
fn uploads_are_idempotent_resumable_and_shared() {
    let store = BlobStore::new(64 << 20);
    let bytes = pattern(3 * MAX_CHUNK, 2);
    let (none, now) = (HashSet::new(), Instant::now());
    // A first uploader sends one chunk, then stops (its connection broke).
    assert_eq!(store.put(chunk(&bytes, 0, MAX_CHUNK), &none, now).expect("first"), PutOutcome { held: false, next_offset: MAX_CHUNK as u64 });
    // The same chunk again stores nothing and says where things stand.
    assert_eq!(store.put(chunk(&bytes, 0, MAX_CHUNK), &none, now).expect("again").next_offset, MAX_CHUNK as u64);
    // A chunk from further on too.
    assert_eq!(store.put(chunk(&bytes, 2 * MAX_CHUNK, MAX_CHUNK), &none, now).expect("ahead").next_offset, MAX_CHUNK as u64);
    // A second uploader asks and continues where the first stopped.
    upload(&store, &bytes, &none, now).expect("finished by another");
    assert!(store.holds(&sha_of(&bytes), bytes.len() as u64));
    // Once held, any call is answered at once.
    assert_eq!(store.put(chunk(&bytes, 0, MAX_CHUNK), &none, now).expect("held"), PutOutcome { held: true, next_offset: bytes.len() as u64 });
}

#[test]
fn bytes_that_do_not_hash_to_the_name_are_dropped() {
    let store = BlobStore::new(64 << 20);
    let bytes = pattern(MAX_CHUNK + 10, 3);
    let mut forged = chunk(&bytes, 0, MAX_CHUNK);
    forged.sha256 = sha_of(b"something else");
    let (none, now) = (HashSet::new(), Instant::now());
    store.put(forged.clone(), &none, now).expect("first chunk");
    forged.offset = MAX_CHUNK as u64;
    forged.data = Bytes::copy_from_slice(&bytes[MAX_CHUNK..]);
    let e = store.put(forged.clone(), &none, now).expect_err("hash differs");
    assert!(e.to_string().starts_with(&format!("blob {}: the uploaded bytes hash to {}", forged.sha256, sha_of(&bytes))), "{e}");
    assert_eq!(tonic::Status::from(e).code(), tonic::Code::InvalidArgument);
    assert!(!store.holds(&forged.sha256, bytes.len() as u64));
    // The upload is gone: it starts over from 0.
    forged.offset = 0;
    forged.data = Bytes::new();
    assert_eq!(store.put(forged, &none, now).expect("ask").next_offset, 0);
}

#[test]
fn malformed_chunks_are_refused_in_one_line() {
    let store = BlobStore::new(64 << 20);
    let bytes = pattern(100, 4);
    let (none, now) = (HashSet::new(), Instant::now());
    let mut c = chunk(&bytes, 0, 100);
    c.sha256 = "ABC".into();
    let e = store.put(c, &none, now).expect_err("bad name").to_string();
    assert!(e.contains("not a SHA-256"), "{e}");
    let mut c = chunk(&bytes, 0, 100);
    c.data = Bytes::from(vec![0; MAX_CHUNK + 1]);
    assert!(store.put(c, &none, now).expect_err("too big").to_string().contains("over the 1048576"));
    let mut c = chunk(&bytes, 0, 100);
    c.size = 50;
    assert!(store.put(c, &none, now).expect_err("runs past").to_string().contains("run past its size of 50"));
    store.put(chunk(&bytes, 0, 10), &none, now).expect("started");
    let mut c = chunk(&bytes, 10, 10);
    c.size = 200;
    let e = store.put(c, &none, now).expect_err("other size").to_string();
    assert!(e.contains("is being uploaded with 100 bytes, not 200") && !e.contains('\n'), "{e}");
}

#[test]
fn the_budget_bounds_blobs_and_evicts_only_what_no_job_needs() {
    let store = BlobStore::new(5 * MAX_CHUNK as u64);
    let now = Instant::now();
    let (a, b, c) = (pattern(2 * MAX_CHUNK, 5), pattern(2 * MAX_CHUNK, 6), pattern(2 * MAX_CHUNK, 7));
    let too_big = pattern(5 * MAX_CHUNK + 1, 8);
    let e = upload(&store, &too_big, &HashSet::new(), now).expect_err("over the budget");
    let text = e.to_string();
    assert!(text.contains("is larger than this coordinator's blob budget of 5.2 MB") && text.contains("--blob-budget"), "{text}");
    assert_eq!(tonic::Status::from(e).code(), tonic::Code::ResourceExhausted);

    // a and b fill 4 of 5 MiB; both run jobs: c cannot fit.
    let running: HashSet<String> = [sha_of(&a), sha_of(&b)].into();
    upload(&store, &a, &running, now).expect("a");
    upload(&store, &b, &running, now + Duration::from_secs(1)).expect("b");
    let e = upload(&store, &c, &running, now).expect_err("full").to_string();
    assert!(e.contains("does not fit") && e.contains("4.2 MB of this coordinator's 5.2 MB"), "{e}");
    // Once a's job finished, a makes room for c; b stays.
    let running: HashSet<String> = [sha_of(&b), sha_of(&c)].into();
    upload(&store, &c, &running, now).expect("c");
    assert!(!store.holds(&sha_of(&a), a.len() as u64));
    assert!(store.holds(&sha_of(&b), b.len() as u64) && store.holds(&sha_of(&c), c.len() as u64));
}

#[test]
fn a_stalled_upload_gives_its_room_to_another_after_a_while() {
    let store = BlobStore::new(3 * MAX_CHUNK as u64);
    let (a, b) = (pattern(2 * MAX_CHUNK, 9), pattern(2 * MAX_CHUNK, 10));
    let (none, now) = (HashSet::new(), Instant::now());
    store.put(chunk(&a, 0, MAX_CHUNK), &none, now).expect("a starts, then its uploader dies");
    assert!(upload(&store, &b, &none, now + Duration::from_secs(1)).is_err(), "a's room is reserved");
    upload(&store, &b, &none, now + STALE_UPLOAD).expect("a's upload is stale");
    // a starts over, and does not fit next to b while b's job runs.
    let running: HashSet<String> = [sha_of(&b)].into();
    assert!(store.put(chunk(&a, 0, MAX_CHUNK), &running, now + STALE_UPLOAD).is_err());
}
