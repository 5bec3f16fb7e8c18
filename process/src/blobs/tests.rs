use std::io::{Read, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::*;

fn sha_of(bytes: &[u8]) -> String {
    let mut sha = Sha256::default();
    sha.update(bytes);
    sha.finish()
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> =
        std::fs::read_dir(dir).expect("list").flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    names
}

#[test]
fn the_environment_names_the_directory_in_order() {
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |name: &str| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| OsString::from(v))
    };
    assert_eq!(
        default_path(env(&[("LOADER_BLOB_DIR", "/b"), ("XDG_RUNTIME_DIR", "/run/user/7")])),
        PathBuf::from("/b")
    );
    assert_eq!(default_path(env(&[("XDG_RUNTIME_DIR", "/run/user/7")])), PathBuf::from("/run/user/7/loader-blobs"));
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    assert_eq!(default_path(env(&[("TMPDIR", "/scratch")])), PathBuf::from(format!("/scratch/loader-blobs-{uid}")));
    assert_eq!(default_path(env(&[("XDG_RUNTIME_DIR", "")])), PathBuf::from(format!("/tmp/loader-blobs-{uid}")));
}

#[test]
fn a_directory_is_created_private_and_one_open_to_others_is_refused() {
    let root = tempfile::tempdir().expect("tempdir");
    let made = root.path().join("a/b");
    let dir = BlobDir::open(&made).expect("created");
    assert_eq!(std::fs::metadata(dir.path()).expect("stat").mode() & 0o777, 0o700);
    BlobDir::open(&made).expect("opens again");

    let open = root.path().join("open");
    std::fs::create_dir(&open).expect("mkdir");
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    BlobDir::open(&open).expect("others may read a directory its owner opened to them");
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o775)).expect("chmod");
    let e = BlobDir::open(&open).expect_err("0775").to_string();
    assert!(e.contains("mode 0775 lets other users write") && e.contains("LOADER_BLOB_DIR"), "{e}");
    assert!(!e.contains('\n'));

    let file = root.path().join("file");
    std::fs::write(&file, b"x").expect("write");
    assert!(BlobDir::open(&file).is_err(), "a file");
    let link = root.path().join("link");
    std::os::unix::fs::symlink(&made, &link).expect("symlink");
    let e = BlobDir::open(&link).expect_err("symlink").to_string();
    assert!(e.contains("not a directory"), "{e}");
}

#[test]
fn a_blob_is_filled_once_checked_and_left_read_only() {
    let root = tempfile::tempdir().expect("tempdir");
    let dir = BlobDir::open(root.path().join("blobs")).expect("dir");
    let bytes = vec![7u8; 3 << 20];
    let sha = sha_of(&bytes);
    let fills = AtomicUsize::new(0);
    let fill = |w: &mut BlobWriter| -> Result<(), io::Error> {
        fills.fetch_add(1, Ordering::SeqCst);
        // In chunks, as a fetch writes them.
        for chunk in bytes.chunks(1 << 20) {
            w.write_all(chunk)?;
        }
        Ok(())
    };
    let mut file = dir.obtain(&sha, bytes.len() as u64, Duration::from_secs(5), fill).expect("filled");
    let mut back = Vec::new();
    file.read_to_end(&mut back).expect("read");
    assert!(back == bytes, "same bytes");
    dir.obtain(&sha, bytes.len() as u64, Duration::from_secs(5), fill).expect("present");
    assert_eq!(fills.load(Ordering::SeqCst), 1, "present: not filled again");
    let meta = std::fs::metadata(dir.file_of(&sha)).expect("stat");
    assert_eq!(meta.mode() & 0o777, 0o400, "read-only");
    assert!(dir.open_blob(&sha, 5).is_none(), "another size is another blob");
    assert_eq!(names(dir.path()), vec![sha.clone(), format!("{sha}.lock")]);
}

#[test]
fn bytes_that_do_not_hash_right_or_a_failed_fill_leave_nothing() {
    let root = tempfile::tempdir().expect("tempdir");
    let dir = BlobDir::open(root.path().join("blobs")).expect("dir");
    let sha = sha_of(b"right");
    let e = dir
        .obtain(&sha, 5, Duration::from_secs(1), |w| w.write_all(b"wrong"))
        .expect_err("mismatch")
        .to_string();
    assert!(e.starts_with(&format!("blob {sha}: received 5 bytes hashing to ")), "{e}");
    let failed = dir.obtain(&sha, 5, Duration::from_secs(1), |w| {
        w.write_all(b"ri")?;
        Err(io::Error::other("connection reset"))
    });
    assert!(matches!(failed, Err(ObtainError::Fill(_))));
    assert_eq!(names(dir.path()), vec![format!("{sha}.lock")], "no blob, no temporary file");
}

#[test]
fn racing_processes_fill_a_blob_once() {
    let root = tempfile::tempdir().expect("tempdir");
    let dir = BlobDir::open(root.path().join("blobs")).expect("dir");
    let bytes = b"shared".to_vec();
    let sha = sha_of(&bytes);
    let fills = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (dir, sha, bytes, fills) = (dir.clone(), sha.clone(), bytes.clone(), fills.clone());
            std::thread::spawn(move || {
                // Each thread opens the lock file itself, as a process does.
                dir.obtain(&sha, bytes.len() as u64, Duration::from_secs(10), |w| {
                    fills.fetch_add(1, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(100));
                    w.write_all(&bytes)
                })
                .map(|_| ())
                .map_err(|e| e.to_string())
            })
        })
        .collect();
    for t in threads {
        t.join().expect("thread").expect("obtained");
    }
    assert_eq!(fills.load(Ordering::SeqCst), 1, "the others waited for the first");
    assert_eq!(std::fs::read(dir.file_of(&sha)).expect("read"), bytes);
}

#[test]
fn a_sweep_removes_what_nobody_used_for_an_hour_and_nothing_else() {
    let root = tempfile::tempdir().expect("tempdir");
    let dir = BlobDir::open(root.path().join("blobs")).expect("dir");
    let (old, fresh) = (sha_of(b"old"), sha_of(b"fresh"));
    for (name, bytes) in [(&old, b"old".as_slice()), (&fresh, b"fresh")] {
        dir.obtain(name, bytes.len() as u64, Duration::ZERO, |w| w.write_all(bytes)).expect("obtained");
    }
    std::fs::write(dir.path().join("notes.txt"), b"not ours").expect("write");
    std::fs::write(dir.path().join(".tmp-1-2-3"), b"left by a killed writer").expect("write");
    let two_hours_ago = SystemTime::now() - Duration::from_secs(7200);
    for name in [old.clone(), format!("{old}.lock"), "notes.txt".into(), ".tmp-1-2-3".into()] {
        let times = std::fs::FileTimes::new().set_accessed(two_hours_ago).set_modified(two_hours_ago);
        // Read-only files too: the owner may set their times.
        File::open(dir.path().join(&name)).expect("open").set_times(times).expect("set times");
    }
    assert_eq!(dir.sweep(UNUSED_FOR, SWEEP_ENTRIES), 3);
    assert_eq!(names(dir.path()), vec![fresh.clone(), format!("{fresh}.lock"), "notes.txt".into()]);
    // Using a blob keeps it.
    assert!(dir.open_blob(&fresh, 5).is_some());
    assert_eq!(dir.sweep(Duration::from_secs(60), SWEEP_ENTRIES), 0);
}

#[test]
fn files_hash_as_their_bytes() {
    let root = tempfile::tempdir().expect("tempdir");
    let path = root.path().join("f");
    std::fs::write(&path, b"abc").expect("write");
    assert_eq!(
        hash_file(&path).expect("hash"),
        ("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad".to_owned(), 3)
    );
}
